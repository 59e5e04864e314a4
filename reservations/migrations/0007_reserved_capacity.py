# Reserved capacity for groups (issue 19): written by hand (the reservations app is edited by several people at once).

import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("nodes", "0010_mig_event_label"),
        ("reservations", "0006_offered"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="ReservedCapacity",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                (
                    "count",
                    models.PositiveSmallIntegerField(
                        blank=True,
                        help_text="Keep this many of the node's GPUs, whichever, for the group (instead of naming GPUs).",
                        null=True,
                        verbose_name="any N GPUs",
                    ),
                ),
                (
                    "label",
                    models.CharField(
                        blank=True, help_text="Shown on the calendar with the group's name.", max_length=200
                    ),
                ),
                ("start", models.DateTimeField(help_text="The (first) window's start.")),
                ("end", models.DateTimeField(help_text="The (first) window's end.")),
                (
                    "rule",
                    models.CharField(
                        blank=True,
                        help_text='Empty: once. Otherwise e.g. "FREQ=WEEKLY;BYDAY=MO;UNTIL=20270331" (UNTIL or COUNT required).',
                        max_length=500,
                        verbose_name="repeat rule (RRULE)",
                    ),
                ),
                (
                    "zone",
                    models.CharField(
                        blank=True,
                        help_text="The zone whose wall-clock time a repeating window keeps, e.g. Europe/Berlin (default: UTC).",
                        max_length=64,
                        verbose_name="time zone",
                    ),
                ),
                (
                    "release_hours_before",
                    models.PositiveIntegerField(
                        blank=True,
                        help_text="Hours before each occurrence's start from which everyone may book it. Empty: the site default RESERVED_RELEASE_HOURS; 0: never released.",
                        null=True,
                    ),
                ),
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
                (
                    "gpus",
                    models.ManyToManyField(
                        blank=True,
                        help_text="The GPUs (cards or MIG slices) kept for the group; or leave empty and give a count.",
                        related_name="reserved_capacity",
                        to="nodes.gpu",
                        verbose_name="GPUs",
                    ),
                ),
                (
                    "group",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="reserved_capacity", to="auth.group"
                    ),
                ),
                (
                    "node",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE, related_name="reserved_capacity", to="nodes.node"
                    ),
                ),
            ],
            options={
                "verbose_name": "reserved capacity",
                "verbose_name_plural": "reserved capacity",
                "ordering": ["start", "id"],
            },
        ),
        migrations.CreateModel(
            name="ReservedRelease",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("occurrence_start", models.DateTimeField()),
                ("released_at", models.DateTimeField(default=django.utils.timezone.now)),
                (
                    "reserved",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="releases",
                        to="reservations.reservedcapacity",
                    ),
                ),
            ],
        ),
        migrations.AddIndex(
            model_name="reservedcapacity",
            index=models.Index(fields=["node", "start"], name="reserved_node_start_idx"),
        ),
        migrations.AddConstraint(
            model_name="reservedcapacity",
            constraint=models.CheckConstraint(
                condition=models.Q(("end__gt", models.F("start"))), name="reserved_end_after_start"
            ),
        ),
        migrations.AddConstraint(
            model_name="reservedcapacity",
            constraint=models.CheckConstraint(
                condition=models.Q(("count__isnull", True), ("count__gt", 0), _connector="OR"),
                name="reserved_count_positive",
            ),
        ),
        migrations.AddConstraint(
            model_name="reservedrelease",
            constraint=models.UniqueConstraint(fields=("reserved", "occurrence_start"), name="reserved_release_once"),
        ),
    ]
