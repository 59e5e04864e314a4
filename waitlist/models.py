"""Waiting for GPUs that are taken: one row per want (docs/booking-rules.md, "Waitlist")."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q

from nodes.models import Gpu, Node


class Entry(models.Model):
    """Someone waiting for GPU time: which GPUs (these ones, or any ``count`` on a node or of a model), for
    how long, inside which window. When capacity frees up inside the window, the best waiting entry (fair
    share first, then arrival) is offered a slot, held for them as an OFFERED reservation (``offer``), which
    is booked for them at once (``auto_book``) or waits ``WAITLIST_CLAIM_MINUTES`` for them to claim it."""

    class Status(models.TextChoices):
        WAITING = "waiting", "Waiting"
        OFFERED = "offered", "Offered a slot"
        BOOKED = "booked", "Booked"
        LAPSED = "lapsed", "Offer not claimed in time"
        DECLINED = "declined", "Offer declined"
        EXPIRED = "expired", "Window passed"
        LEFT = "left", "Left the waitlist"

    OPEN_STATUSES = (Status.WAITING, Status.OFFERED)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="waitlist_entries")
    # The want: these GPUs (``gpus``), or any ``count`` bookable units on ``node`` (of MIG ``profile`` if
    # set), or any ``count`` of ``gpu_model`` on one node. ``node`` is set for the first two kinds.
    node = models.ForeignKey(Node, null=True, blank=True, on_delete=models.CASCADE, related_name="+")
    gpus = models.ManyToManyField(Gpu, blank=True, related_name="+")
    gpu_model = models.CharField(max_length=100, blank=True)
    profile = models.CharField(max_length=32, blank=True, help_text="A MIG profile such as 3g.40gb.")
    count = models.PositiveSmallIntegerField(default=1)
    earliest_start = models.DateTimeField()
    latest_end = models.DateTimeField()
    duration = models.DurationField()
    purpose = models.TextField(blank=True)
    auto_book = models.BooleanField(
        default=True, help_text="Book an offered slot at once (within the limits) instead of waiting for a claim."
    )

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.WAITING)
    created_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    # The slot on offer while OFFERED; the booking once BOOKED.
    reservation = models.ForeignKey(
        "reservations.Reservation", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    offered_at = models.DateTimeField(null=True, blank=True)
    claim_by = models.DateTimeField(null=True, blank=True)
    # Why the entry was passed over the last time it could have had a slot (its limits), for its owner.
    skip_reason = models.TextField(blank=True)
    skipped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "waitlist entry"
        verbose_name_plural = "waitlist entries"
        ordering = ["created_at", "pk"]
        constraints = [
            models.CheckConstraint(condition=Q(latest_end__gt=F("earliest_start")), name="waitlist_window_not_empty"),
            models.CheckConstraint(condition=Q(count__gte=1), name="waitlist_count_positive"),
        ]
        indexes = [models.Index(fields=["status", "latest_end"], name="waitlist_status_end_idx")]

    def __str__(self) -> str:
        return f"waitlist #{self.pk} {self.user} {self.want_text}"

    @property
    def is_open(self) -> bool:
        return self.status in self.OPEN_STATUSES

    @property
    def want_text(self) -> str:
        """What the entry waits for, in words ("any 2 GPUs on gpu-a100 for 2 h")."""
        hours = self.duration.total_seconds() / 3600
        length = f"{hours:g} h" if hours >= 1 else f"{round(hours * 60)} min"
        if self.pk and self.gpus.exists():
            what = ", ".join(str(gpu) for gpu in self.gpus.order_by("index", "placement_start"))
        else:
            unit = f"{self.profile} slice" if self.profile else "GPU"
            plural = "s" if self.count > 1 else ""
            where = f"on {self.node.name}" if self.node is not None else f"of model {self.gpu_model}"
            what = f"any {self.count} {unit}{plural} {where}"
        return f"{what} for {length}"
