"""Alerts for admins: a record per condition (a hot GPU, an offline node, a violation, periodic
jobs late...), open while it lasts, then resolved; the streaks that decide when a condition read
from telemetry becomes an alert (alerts/conditions.py); and the periodic jobs' last successes
(alerts/jobs.py)."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models.functions import Coalesce

from nodes.models import Gpu, Node


class Alert(models.Model):
    class Kind(models.TextChoices):
        TEMPERATURE = "temperature", "GPU too hot"
        ECC = "ecc", "Uncorrected ECC errors"
        OFFLINE = "offline", "Node offline"
        VIOLATION = "violation", "Use without a booking"
        LEFTOVER = "leftover", "Processes left after a slot"
        UNKILLABLE = "unkillable", "GPU could not be emptied"
        IDLE = "idle", "Booked GPU left idle"
        ACCOUNT_REFUSED = "account_refused", "Account refused by a node"
        JOBS_LATE = "jobs_late", "Periodic jobs late"
        SLICE_GONE = "slice_gone", "Booked MIG slice gone"
        SLURM_UNREACHABLE = "slurm_unreachable", "Slurm controller unreachable"
        SLURM_REFUSED = "slurm_refused", "Booking refused by Slurm"
        MIG_LAYOUT_CHANGED = "mig_layout_changed", "MIG layout changed, waiting for confirmation"

    kind = models.CharField(max_length=20, choices=Kind.choices)
    # None for an alert about the portal itself (periodic jobs late) or a Slurm cluster's controller.
    node = models.ForeignKey(Node, on_delete=models.CASCADE, null=True, blank=True, related_name="alerts")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, null=True, blank=True, related_name="alerts")
    # The person concerned, as the agent names them (a unix username: it may have no portal account),
    # and their portal account when there is one.
    username = models.CharField(max_length=32, blank=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    reservation = models.ForeignKey(
        "reservations.Reservation", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    opened_at = models.DateTimeField()
    last_bad_at = models.DateTimeField(help_text="The latest bad reading or event.")
    resolved_at = models.DateTimeField(null=True, blank=True)
    resolved_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    resolution = models.CharField(max_length=200, blank=True)
    details = models.JSONField(default=dict, blank=True, help_text="The readings or events behind it.")
    # Staff mail: claimed (a compare-and-swap on ``notified_at``) for a mail, alone or in a summary;
    # the alerts of one mail share ``mail_id``. Unset while the hourly rate limit holds it back.
    # ``mailed_at`` is set once the mail went: a claim without it that is older than
    # NOTIFY_CLAIM_SECONDS belonged to a sender that died, and the mail goes again.
    notified_at = models.DateTimeField(null=True, blank=True)
    mail_id = models.UUIDField(null=True, blank=True, editable=False)
    mailed_at = models.DateTimeField(null=True, blank=True)
    # Idle booked GPUs: the holder's mail, and the automatic release (IDLE_AUTO_RELEASE_MINUTES).
    holder_notified_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-opened_at", "-id"]
        constraints = [
            # At most one open alert per (kind, node, GPU, person): two evaluations at once cannot
            # open it twice. COALESCE because NULLs are distinct in a unique index (an offline
            # alert has no GPU, a jobs-late alert no node), on PostgreSQL and SQLite alike.
            models.UniqueConstraint(
                "kind",
                Coalesce("node", 0),
                Coalesce("gpu", 0),
                "username",
                condition=models.Q(resolved_at__isnull=True),
                name="alert_one_open_per_subject",
            ),
        ]
        indexes = [
            models.Index(fields=["kind", "notified_at"], name="alert_kind_notified_idx"),
            models.Index(fields=["node"], condition=models.Q(resolved_at__isnull=True), name="alert_open_node_idx"),
        ]

    def __str__(self) -> str:
        where = self.node.name if self.node else "the portal"
        if self.kind == self.Kind.SLURM_UNREACHABLE:
            where = "the Slurm cluster"
        if self.gpu:
            where = f"{where}/GPU {self.gpu.index}"
        who = f" ({self.username})" if self.username else ""
        return f"{self.get_kind_display()}: {where}{who}"

    @property
    def is_open(self) -> bool:
        return self.resolved_at is None


class AlertStreak(models.Model):
    """A condition under watch on one GPU: consecutive bad readings (temperature, ECC), or an alert
    opened by an event (violation, leftover) that the next telemetry may clear. The telemetry path
    reads a node's streaks once per report; a GPU with nothing wrong has none."""

    kind = models.CharField(max_length=20, choices=Alert.Kind.choices)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="+")
    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    username = models.CharField(max_length=32, blank=True)
    # Counted up to BAD_READINGS_TO_OPEN (the alert opens there); later bad readings move only the
    # alert's last_bad_at.
    count = models.PositiveIntegerField(default=0, help_text="Bad readings in a row.")
    readings = models.JSONField(default=list, blank=True, help_text="The first bad readings.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["kind", "gpu", "username"], name="alert_streak_unique")]
        indexes = [models.Index(fields=["node"], name="alert_streak_node_idx")]

    def __str__(self) -> str:
        return f"{self.kind} on GPU {self.gpu_id}: {self.count}"


class PeriodicJob(models.Model):
    """An entry of beat's schedule (portal/celery.py), by its name: when a run of it beat started
    last succeeded (recorded by the worker, alerts/jobs.py), and since when the portal watches it (a
    job that never succeeded is late counting from then)."""

    name = models.CharField(max_length=200, primary_key=True)
    task = models.CharField(max_length=200, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    watched_since = models.DateTimeField()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name
