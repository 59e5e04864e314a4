"""What mail each person wants, and every mail the portal sends: the outbox (``Notification``)."""

from __future__ import annotations

from typing import ClassVar

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
    # Idle booked GPUs (alerts/): the holder is told, and told again if the portal releases the booking.
    IDLE = "alert_idle", "Booked GPUs idle"
    IDLE_RELEASED = "alert_idle_released", "Idle booking released"
    # A MIG slice a booking names vanished from its node (alerts/): the holder must hear of it.
    SLICE_GONE = "slice_gone", "Booked MIG slice gone"
    # A slot held for someone on the waitlist (waitlist/) who must claim it in time.
    WAITLIST_OFFER = "waitlist_offer", "Waitlist: a slot to claim"


class MailPreferences(models.Model):
    """One switch per kind of mail (all on until the person turns one off)."""

    # Which switch governs which kind; a kind with none always goes (idle GPUs: the portal may release
    # the booking, so the holder must hear of it).
    SWITCH_OF: ClassVar[dict[str, str]] = {
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
        switch = self.SWITCH_OF.get(kind)
        return switch is None or getattr(self, switch)


class Notification(models.Model):
    """One mail of one kind about one booking for one person, at most one row: the outbox.

    (kind, reservation, user, moment) is unique, so however many changes, beats or retries ask for a
    mail, there is one row; ``moment`` is the slot end a reminder was for (an extended slot gets a new
    reminder), else the booking's start (or the new end, for an approved extension). A change writes
    its mails' rows in its own transaction (notifications.hooks), so a mail exists exactly when the
    change committed, whether or not the broker was there to nudge a worker.

    Sending is at least once: a sender claims a row by a compare-and-swap that sets
    ``claimed_until`` (free: empty or past), sends, then sets ``sent_at``. A sender that dies between
    the two leaves a claim that expires (NOTIFY_CLAIM_SECONDS) and the row goes again; a send that
    fails pushes ``claimed_until`` later (a backoff) and records the error.
    """

    kind = models.CharField(max_length=32, choices=Kind.choices)
    reservation = models.ForeignKey("reservations.Reservation", on_delete=models.CASCADE, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    moment = models.DateTimeField()
    context = models.JSONField(
        default=dict, blank=True, help_text="What the mail says that was decided when it was written (JSON)."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(
        null=True, blank=True, help_text="When it went, or was skipped; empty while it waits in the outbox."
    )
    claimed_until = models.DateTimeField(
        null=True, blank=True, help_text="A sender holds it until then (sending, or waiting to retry)."
    )
    attempts = models.PositiveIntegerField(default=0, help_text="Sends tried.")
    last_error = models.CharField(max_length=500, blank=True)
    skipped = models.BooleanField(default=False, help_text="Not sent: see why.")
    skip_reason = models.CharField("why not sent", max_length=200, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "reservation", "user", "moment"], name="notification_once")
        ]
        indexes = [
            models.Index(fields=["reservation", "kind"]),
            # The outbox: what beat's drain reads, a few rows however long the log grows.
            models.Index(
                fields=["created_at"], condition=models.Q(sent_at__isnull=True), name="notification_unsent_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.get_kind_display()} for {self.user} (#{self.reservation_id})"
