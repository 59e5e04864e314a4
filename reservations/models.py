from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import RangeBoundary, RangeOperators
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from kernel.fields import moment_problem
from nodes.models import Gpu, Node
from reservations.constraints import Int4Range, PostgresExclusionConstraint, TsTzRange


class Reservation(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending approval"
        APPROVED = "approved", "Approved"
        REJECTED = "rejected", "Rejected"
        CANCELLED = "cancelled", "Cancelled"
        # Held for someone on the waitlist until they take it (reservations/offers.py): it keeps others
        # off the slot, opens nothing and counts against no limit until taken.
        OFFERED = "offered", "Offered from the waitlist"

    # Pending reservations hold their slot until an admin decides.
    LIVE_STATUSES = (Status.PENDING, Status.APPROVED)

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="reservations")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="reservations")
    gpus = models.ManyToManyField(
        Gpu, through="Allocation", through_fields=("reservation", "gpu"), related_name="reservations"
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    purpose = models.TextField(blank=True)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)

    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    decision_reason = models.TextField(blank=True)
    cancelled_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(blank=True)
    # Set when a running slot is ended early; ``end`` then holds the release time.
    released_at = models.DateTimeField(null=True, blank=True)
    # A pending extension is a reservation of its own for the added time, pointing at the booking
    # it extends: it holds the slot while an admin decides, and on approval it is merged into that
    # booking (docs/booking-rules.md, "Extending").
    extends = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="extensions", editable=False
    )
    # An occurrence of a recurring booking (reservations/series.py): the series, and the local day of the
    # occurrence in the series' zone (the rule repeats at most daily, so the day names the occurrence).
    series = models.ForeignKey(
        "Series", null=True, blank=True, on_delete=models.SET_NULL, related_name="occurrences", editable=False
    )
    series_day = models.DateField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["start", "id"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="reservation_end_after_start"),
            # A series holds at most one live booking per occurrence, whoever books it (the form, the
            # daily task that books what came within reach) and however they race.
            models.UniqueConstraint(
                fields=["series", "series_day"],
                condition=Q(status__in=["pending", "approved"]),
                name="reservation_one_live_occurrence",
            ),
        ]
        indexes = [
            models.Index(fields=["status", "start"], name="reservation_status_start_idx"),
            models.Index(fields=["user", "end"], name="reservation_user_end_idx"),
            models.Index(fields=["node", "start"], name="reservation_node_start_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.node.name} {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M} {self.user.get_username()}"

    @property
    def is_live(self) -> bool:
        return self.status in self.LIVE_STATUSES

    def phase(self, now: datetime | None = None) -> str:
        """'upcoming', 'running' or 'past' (by the clock, whatever the status)."""
        now = now or timezone.now()
        if now < self.start:
            return "upcoming"
        if now < self.end:
            return "running"
        return "past"


class Allocation(models.Model):
    """One booked unit (a card or a MIG slice) of a reservation, with its period.

    ``active`` is true while the reservation is live (pending or approved); only active rows take
    part in the no-overlap rule, so a rejected or cancelled booking frees its slot but stays on record.

    ``card`` and the placement range say which part of which physical card the row occupies: a slice
    its GPU instance's memory slices, a whole card all of them (nodes.models.WHOLE_CARD). They are the
    GPU's, copied here so that the database can refuse a booking of a card over one of its slices,
    and the other way round, in one constraint.
    """

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="allocations")
    gpu = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="allocations")
    card = models.ForeignKey(Gpu, on_delete=models.PROTECT, related_name="card_allocations", editable=False)
    placement_start = models.PositiveSmallIntegerField(editable=False)
    placement_end = models.PositiveSmallIntegerField(editable=False)
    start = models.DateTimeField()
    end = models.DateTimeField()
    active = models.BooleanField(default=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["reservation", "gpu"], name="allocation_unique_gpu_per_reservation"),
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="allocation_end_after_start"),
            models.CheckConstraint(
                condition=Q(placement_end__gt=F("placement_start")), name="allocation_placement_not_empty"
            ),
            # The wall: on PostgreSQL no two active allocations of one card can overlap in both its
            # placement (which slices) and time, whatever the code does: a GPU with itself, a slice with
            # its card, two slices whose GPU instances share memory slices. Half-open ranges, so
            # back-to-back slots and neighbouring slices are fine.
            PostgresExclusionConstraint(
                name="allocation_no_overlap_on_card",
                expressions=[
                    ("card", RangeOperators.EQUAL),
                    (Int4Range("placement_start", "placement_end", RangeBoundary()), RangeOperators.OVERLAPS),
                    (TsTzRange("start", "end", RangeBoundary()), RangeOperators.OVERLAPS),
                ],
                condition=Q(active=True),
            ),
        ]
        indexes = [
            models.Index(fields=["gpu", "start", "end"], condition=Q(active=True), name="allocation_active_gpu_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.gpu} {self.start:%Y-%m-%d %H:%M}–{self.end:%H:%M}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.card_id is None:
            self.place(self.gpu)
        super().save(*args, **kwargs)

    def place(self, gpu: Gpu) -> Allocation:
        """Copy ``gpu``'s card and placement (every writer of allocations calls this, bulk writes too)."""
        self.card_id = gpu.card_id
        self.placement_start, self.placement_end = gpu.placement
        return self


class MaintenanceWindow(models.Model):
    """A period when a whole node, or one GPU of it, takes no bookings."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="maintenance_windows")
    gpu = models.ForeignKey(
        Gpu,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="maintenance_windows",
        help_text="Leave empty to block the whole node.",
    )
    start = models.DateTimeField()
    end = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["start"]
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="maintenance_end_after_start"),
        ]

    def __str__(self) -> str:
        target = str(self.gpu) if self.gpu_id else self.node.name
        return f"{target} maintenance {self.start:%Y-%m-%d %H:%M}–{self.end:%Y-%m-%d %H:%M}"

    def clean(self) -> None:
        # The dates every booking keeps to (kernel/fields.py): a window ending near the year 9999
        # overflowed wherever it is shown in a zone east of UTC (a booking refused because of it).
        problems = {name: moment_problem(value) for name in ("start", "end") if (value := getattr(self, name))}
        if any(problems.values()):
            raise ValidationError({name: problem for name, problem in problems.items() if problem})
        if self.start and self.end and self.end <= self.start:
            raise ValidationError({"end": "The end must be after the start."})
        if self.gpu_id and self.node_id and self.gpu is not None and self.gpu.node_id != self.node_id:
            raise ValidationError({"gpu": f"{self.gpu} is not on node {self.node}."})


class Limit(models.Model):
    """Booking limits: the site default, a group's, or one user's override.

    An empty field means "not set here": a user override falls back to their groups (the most
    generous group wins), then to the site default; unset everywhere means no limit, except for how
    far ahead and how long, which fall back to the site ceilings MAX_DAYS_AHEAD and MAX_SLOT_HOURS.
    """

    class Scope(models.TextChoices):
        SITE = "site", "Site default"
        GROUP = "group", "Group"
        USER = "user", "User override"

    scope = models.CharField(max_length=8, choices=Scope.choices)
    group = models.OneToOneField(
        "auth.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="booking_limit"
    )
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="booking_limit",
    )
    max_gpus_at_once = models.PositiveIntegerField(
        "GPUs at once",
        null=True,
        blank=True,
        help_text="How many GPUs one person may hold at the same moment.",
    )
    max_slot_hours = models.DecimalField(
        "longest slot (hours)",
        max_digits=7,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="Unset everywhere: the site ceiling MAX_SLOT_HOURS (168 by default).",
    )
    weekly_gpu_hours = models.DecimalField(
        "GPU-hours per rolling 7 days",
        max_digits=9,
        decimal_places=2,
        null=True,
        blank=True,
        help_text="Counted over every 7-day window that touches the booking.",
    )
    max_days_ahead = models.PositiveIntegerField(
        "days ahead",
        null=True,
        blank=True,
        help_text="How far ahead a booking may end. Unset everywhere: the site ceiling MAX_DAYS_AHEAD (90 by default).",
    )
    requires_approval = models.BooleanField(
        null=True, blank=True, help_text="Whether bookings wait for an admin's approval."
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["scope"], condition=Q(scope="site"), name="limit_one_site_default"),
            models.CheckConstraint(
                condition=(
                    Q(scope="site", group__isnull=True, user__isnull=True)
                    | Q(scope="group", group__isnull=False, user__isnull=True)
                    | Q(scope="user", user__isnull=False, group__isnull=True)
                ),
                name="limit_scope_matches_target",
            ),
        ]

    def __str__(self) -> str:
        if self.scope == self.Scope.GROUP and self.group_id:
            return f"Limits for group {self.group}"
        if self.scope == self.Scope.USER and self.user_id:
            return f"Limits for {self.user}"
        return "Site default limits"

    def clean(self) -> None:
        if self.scope == self.Scope.SITE and (self.group_id or self.user_id):
            raise ValidationError("The site default applies to everyone: leave group and user empty.")
        if self.scope == self.Scope.GROUP and (not self.group_id or self.user_id):
            raise ValidationError({"group": "Choose the group these limits apply to (and no user)."})
        if self.scope == self.Scope.USER and (not self.user_id or self.group_id):
            raise ValidationError({"user": "Choose the user these limits apply to (and no group)."})


class Series(models.Model):
    """A recurring booking: an RFC 5545 rule repeated in the booker's zone (reservations/series.py).

    Every occurrence is a Reservation of its own (``occurrences``), booked, approved, reminded and
    released like any other. The series keeps what to book for the occurrences not booked yet: the
    wall-clock start and duration, which are the same local time of day on every day of the rule
    whatever daylight saving time does, and the GPUs asked for.
    """

    class Mode(models.TextChoices):
        ALL_OR_NOTHING = "all", "All or nothing"
        SKIP_CONFLICTS = "skip", "Skip conflicts"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="booking_series")
    node = models.ForeignKey(Node, on_delete=models.PROTECT, related_name="+")
    gpus = models.ManyToManyField(Gpu, related_name="+")
    rule = models.CharField("repeat rule (RRULE)", max_length=500)
    zone = models.CharField("time zone", max_length=64)
    first_day = models.DateField()
    start_time = models.TimeField("local start time")
    duration = models.DurationField()
    mode = models.CharField(max_length=8, choices=Mode.choices, default=Mode.ALL_OR_NOTHING)
    purpose = models.TextField(blank=True)
    # Set when the series is cancelled from a day on: no occurrence on or after it is booked any more.
    ends_before = models.DateField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "series"
        constraints = [
            models.CheckConstraint(condition=Q(duration__gt=timedelta(0)), name="series_duration_positive"),
        ]

    def __str__(self) -> str:
        return f"Series #{self.pk} {self.rule} {self.start_time:%H:%M} ({self.zone})"


class ReservedCapacity(models.Model):
    """Capacity kept for one group (a lab group or a project: both are django.contrib.auth groups), once or
    repeating: specific GPUs (cards or MIG slices) of a node, any ``count`` GPUs of a node, or any ``count`` GPUs
    of a model (``gpu_model``, on whichever nodes have it; ``node`` empty).

    Inside an occurrence only the group's members (and booking admins) book the reserved GPUs; with a count,
    everyone else together holds at most the node's (or the model's) bookable GPUs minus ``count``. From
    ``release_hours_before`` hours before an occurrence's start (empty: the site's RESERVED_RELEASE_HOURS; 0:
    never) the occurrence restricts nobody any more. The rules are in reservations/reserved.py and
    docs/booking-rules.md.
    """

    group = models.ForeignKey("auth.Group", on_delete=models.CASCADE, related_name="reserved_capacity")
    node = models.ForeignKey(
        Node,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="reserved_capacity",
        help_text="The node of the GPUs or of the count; empty for a count of a GPU model on any node.",
    )
    gpu_model = models.CharField(
        "GPU model",
        max_length=100,
        blank=True,
        help_text="With a count and no node: keep that many GPUs of this model (as the GPUs list it), on any node.",
    )
    gpus = models.ManyToManyField(
        Gpu,
        blank=True,
        related_name="reserved_capacity",
        verbose_name="GPUs",
        help_text="The GPUs (cards or MIG slices) kept for the group; or leave empty and give a count.",
    )
    count = models.PositiveSmallIntegerField(
        "any N GPUs",
        null=True,
        blank=True,
        help_text="Keep this many of the node's GPUs, whichever, for the group (instead of naming GPUs).",
    )
    label = models.CharField(max_length=200, blank=True, help_text="Shown on the calendar with the group's name.")
    start = models.DateTimeField(help_text="The (first) window's start.")
    end = models.DateTimeField(help_text="The (first) window's end.")
    rule = models.CharField(
        "repeat rule (RRULE)",
        max_length=500,
        blank=True,
        help_text='Empty: once. Otherwise e.g. "FREQ=WEEKLY;BYDAY=MO;UNTIL=20270331" (UNTIL or COUNT required).',
    )
    zone = models.CharField(
        "time zone",
        max_length=64,
        blank=True,
        help_text="The zone whose wall-clock time a repeating window keeps, e.g. Europe/Berlin (default: UTC).",
    )
    release_hours_before = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Hours before each occurrence's start from which everyone may book it. "
        "Empty: the site default RESERVED_RELEASE_HOURS; 0: never released.",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["start", "id"]
        verbose_name = "reserved capacity"
        verbose_name_plural = "reserved capacity"
        constraints = [
            models.CheckConstraint(condition=Q(end__gt=F("start")), name="reserved_end_after_start"),
            models.CheckConstraint(condition=Q(count__isnull=True) | Q(count__gt=0), name="reserved_count_positive"),
            # A node, or a count of a model on any node.
            models.CheckConstraint(
                condition=Q(node__isnull=False) | (Q(count__isnull=False) & ~Q(gpu_model="")),
                name="reserved_node_or_model_count",
            ),
        ]
        indexes = [models.Index(fields=["node", "start"], name="reserved_node_start_idx")]

    def __str__(self) -> str:
        what = f"{self.count} GPUs" if self.count else "GPUs"
        return f"{what} of {self.where} for {self.group.name}" + (f" ({self.label})" if self.label else "")

    @property
    def where(self) -> str:
        """What the capacity is kept on, in words: "gpu-a100", "model NVIDIA H100", or both."""
        model = f"model {self.gpu_model}" if self.gpu_model else ""
        if self.node is None:
            return model
        return f"{self.node.name} ({model})" if model else self.node.name

    def covers(self, unit: Gpu) -> bool:
        """Whether a count of this window is taken from ``unit`` (on its node, of its model)."""
        if self.node_id is not None and unit.node_id != self.node_id:
            return False
        return not self.gpu_model or self.gpu_model in (unit.model, unit.parent.model if unit.parent else "")


class ReservedRelease(models.Model):
    """One occurrence of a ReservedCapacity that reached its release time and was announced
    (``reserved_capacity_released``): the row makes the announcement happen once."""

    reserved = models.ForeignKey(ReservedCapacity, on_delete=models.CASCADE, related_name="releases")
    occurrence_start = models.DateTimeField()
    released_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["reserved", "occurrence_start"], name="reserved_release_once"),
        ]

    def __str__(self) -> str:
        return f"{self.reserved} released for {self.occurrence_start:%Y-%m-%d %H:%M}"
