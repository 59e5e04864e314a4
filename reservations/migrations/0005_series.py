# Recurring bookings (issue 19): written by hand (the reservations app is edited by several people at once).

import datetime

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0009_mig_slices"),
        ("reservations", "0004_mig_slices"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="Series",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("rule", models.CharField(max_length=500, verbose_name="repeat rule (RRULE)")),
                ("zone", models.CharField(max_length=64, verbose_name="time zone")),
                ("first_day", models.DateField()),
                ("start_time", models.TimeField(verbose_name="local start time")),
                ("duration", models.DurationField()),
                (
                    "mode",
                    models.CharField(
                        choices=[("all", "All or nothing"), ("skip", "Skip conflicts")], default="all", max_length=8
                    ),
                ),
                ("purpose", models.TextField(blank=True)),
                ("ends_before", models.DateField(blank=True, null=True)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "created_by",
                    models.ForeignKey(
                        blank=True,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="+",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
                ("gpus", models.ManyToManyField(related_name="+", to="nodes.gpu")),
                (
                    "node",
                    models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name="+", to="nodes.node"),
                ),
                (
                    "user",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="booking_series",
                        to=settings.AUTH_USER_MODEL,
                    ),
                ),
            ],
            options={
                "verbose_name_plural": "series",
                "ordering": ["-created_at", "-id"],
                "constraints": [
                    models.CheckConstraint(
                        condition=models.Q(("duration__gt", datetime.timedelta(0))), name="series_duration_positive"
                    )
                ],
            },
        ),
        migrations.AddField(
            model_name="reservation",
            name="series",
            field=models.ForeignKey(
                blank=True,
                editable=False,
                null=True,
                on_delete=django.db.models.deletion.SET_NULL,
                related_name="occurrences",
                to="reservations.series",
            ),
        ),
        migrations.AddField(
            model_name="reservation",
            name="series_day",
            field=models.DateField(blank=True, editable=False, null=True),
        ),
        migrations.AddConstraint(
            model_name="reservation",
            constraint=models.UniqueConstraint(
                condition=models.Q(("status__in", ["pending", "approved"])),
                fields=("series", "series_day"),
                name="reservation_one_live_occurrence",
            ),
        ),
    ]
