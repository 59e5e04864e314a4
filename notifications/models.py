"""What mail each person wants, and every mail the portal sent (or chose not to send)."""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Kind(models.TextChoices):
    BOOKING_CONFIRMED = "booking_confirmed", "Booking confirmed"
    BOOKING_PENDING = "booking_pending", "Booking waiting for approval"
    APPROVAL_NEEDED = "approval_needed", "Approval needed (admins)"
    APPROVED = "approved", "Booking approved"
    REJECTED = "rejected", "Booking rejected"
    SLOT_STARTING = "slot_starting", "Slot starting"
    SLOT_ENDING = "slot_ending", "Slot ending soon"
    SLOT_ENDED = "slot_ended", "Slot ended, with usage"


class MailPreferences(models.Model):
    """One switch per kind of mail (all on until the person turns one off)."""

    # Which switch governs which kind.
    SWITCH_OF = {
        Kind.BOOKING_CONFIRMED: "booking_received",
        Kind.BOOKING_PENDING: "booking_received",
        Kind.APPROVAL_NEEDED: "approval_requests",
        Kind.APPROVED: "decisions",
        Kind.REJECTED: "decisions",
        Kind.SLOT_STARTING: "slot_starting",
        Kind.SLOT_ENDING: "slot_ending",
        Kind.SLOT_ENDED: "slot_ended",
    }

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="mail_preferences")
    booking_received = models.BooleanField(
        "booking confirmed or waiting for approval", default=True, help_text="When you book."
    )
    decisions = models.BooleanField("approved or rejected", default=True, help_text="When an admin decides.")
    slot_starting = models.BooleanField(
        "slot starting", default=True, help_text="With the host to ssh to and the GPUs to use."
    )
    slot_ending = models.BooleanField(
        "slot ending soon",
        default=True,
        help_text="The reminder before the end (how long before: your profile's reminder setting).",
    )
    slot_ended = models.BooleanField("slot ended", default=True, help_text="With how much the GPUs were used.")
    approval_requests = models.BooleanField(
        "approval needed", default=True, help_text="Admins: a booking waits for your decision."
    )

    class Meta:
        verbose_name = "mail preferences"
        verbose_name_plural = "mail preferences"

    def __str__(self) -> str:
        return f"mail preferences of {self.user}"

    def wants(self, kind: str) -> bool:
        return getattr(self, self.SWITCH_OF[kind])


class Notification(models.Model):
    """One mail of one kind about one booking for one person, at most once.

    The row is the mail's identity: (kind, reservation, user, moment) is unique, so however many
    beats or retries look at a booking, there is one row; ``sent_at`` is flipped from empty by a
    compare-and-swap (``UPDATE ... WHERE sent_at IS NULL``), so one of them sends. ``moment`` is the
    slot end a reminder was for (an extended slot gets a new reminder), else the booking's start.
    """

    kind = models.CharField(max_length=32, choices=Kind.choices)
    reservation = models.ForeignKey("reservations.Reservation", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    moment = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    skipped = models.BooleanField(default=False, help_text="Not sent: the person turned this kind off.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "reservation", "user", "moment"], name="notification_once")
        ]
        indexes = [models.Index(fields=["reservation", "kind"])]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} for {self.user} (#{self.reservation_id})"
