from __future__ import annotations

import secrets

from django.core.validators import RegexValidator
from django.db import models

# A node's name is also its Celery queue name (node.<name>) and appears in paths, so it is kept to
# what a DNS label allows.
validate_node_name = RegexValidator(
    r"\A[a-z0-9][a-z0-9-]{0,62}\Z",
    "Use 1 to 63 lower-case letters, digits or '-', starting with a letter or digit.",
)
validate_gpu_uuid = RegexValidator(
    r"\A(GPU|MIG)-[0-9a-fA-F-]{8,64}\Z",
    "Use the UUID NVML reports, like GPU-5f2c1d7e-... or MIG-...",
)


def _new_secret() -> str:
    return secrets.token_hex(32)


class Node(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        MAINTENANCE = "maintenance", "In maintenance"
        DISABLED = "disabled", "Disabled"

    name = models.CharField(max_length=63, unique=True, validators=[validate_node_name])
    hostname = models.CharField(max_length=253, help_text="The host researchers ssh to.")
    description = models.TextField(blank=True)
    status = models.CharField(
        max_length=16,
        choices=Status.choices,
        default=Status.ACTIVE,
        help_text="Only active nodes take new bookings; existing bookings are kept.",
    )
    requires_approval = models.BooleanField(
        default=False, help_text="Every booking on this node waits for an admin's approval."
    )
    # The agent's credentials: the secret signs lease snapshots (HMAC), the token authenticates its
    # reports (only a hash is kept). Both are shown once, by `manage.py register_node`.
    lease_secret = models.CharField(max_length=128, default=_new_secret, editable=False)
    agent_token_hash = models.CharField(max_length=64, blank=True, editable=False)
    # Every snapshot sent to the node carries a higher version; the agent refuses older ones.
    lease_version = models.PositiveBigIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def is_bookable(self) -> bool:
        return self.status == self.Status.ACTIVE


class Gpu(models.Model):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(help_text="The index NVML gives this GPU on its node.")
    uuid = models.CharField("UUID", max_length=80, unique=True, validators=[validate_gpu_uuid])
    model = models.CharField(max_length=100)
    memory_mib = models.PositiveIntegerField("memory (MiB)")
    bookable = models.BooleanField(default=True)
    # Room for MIG: a slice points at the physical GPU it belongs to.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="slices")

    class Meta:
        ordering = ["node__name", "index"]
        constraints = [
            models.UniqueConstraint(
                fields=["node", "index"],
                condition=models.Q(parent__isnull=True),
                name="gpu_unique_index_per_node",
            ),
        ]
        verbose_name = "GPU"

    def __str__(self) -> str:
        return f"{self.node.name}/GPU {self.index}"

    @property
    def memory_gb(self) -> int:
        return round(self.memory_mib / 1024)
