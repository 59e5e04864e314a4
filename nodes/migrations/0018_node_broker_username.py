"""Each node's broker user keeps its name (nodes/broker_users.py): users made before portals had a prefix of
their own were ``node-<name>``, and their agents' BROKER_URLs say so, so they keep that name until the node's
credentials are issued again (docs/operations.md, "Upgrades")."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models
from django.db.models import F, Value
from django.db.models.functions import Concat


def name_the_existing_users(apps: Any, schema_editor: Any) -> None:
    Node = apps.get_model("nodes", "Node")
    Node.objects.using(schema_editor.connection.alias).exclude(broker_password_hash="").update(
        broker_username=Concat(Value("node-"), F("name"), output_field=models.CharField())
    )


class Migration(migrations.Migration):
    dependencies = [
        ("nodes", "0017_mig_card_layout_confirmed"),
    ]

    operations = [
        migrations.AddField(
            model_name="node",
            name="broker_username",
            field=models.CharField(blank=True, editable=False, max_length=128),
        ),
        migrations.RunPython(name_the_existing_users, migrations.RunPython.noop, elidable=True),
    ]
