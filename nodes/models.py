from __future__ import annotations

import secrets
from fractions import Fraction

from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from gpubook_agent.protocol import IDLE_POWER_LIMIT_PCT_MAX, IDLE_POWER_LIMIT_PCT_MIN

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

    class Manager(models.TextChoices):
        AGENT = "agent", "Our node agent (ACLs on the GPUs)"
        SLURM = "slurm", "Slurm (each booking an advance reservation)"

    manager = models.CharField(
        max_length=8,
        choices=Manager.choices,
        default=Manager.AGENT,
        help_text="Who enforces bookings here: our agent, or the Slurm cluster the node belongs to (docs/slurm.md).",
    )
    # Set by the manager's link, not by hand: Slurm releases before 23.11 reserve whole nodes only (they refuse
    # GPU TRES in reservations; docs/slurm.md), so the portal books those whole rather than pretend.
    books_whole = models.BooleanField(
        default=False,
        editable=False,
        help_text="A booking here takes every GPU of the node (a Slurm cluster that reserves whole nodes only).",
    )
    manager_state = models.CharField(
        max_length=300,
        blank=True,
        editable=False,
        help_text="What the node's manager last said of it: Slurm's state and reason (IDLE+DRAIN: new disk).",
    )
    manager_down = models.BooleanField(
        default=False,
        editable=False,
        help_text="Its manager says it is down or not responding (Slurm: DOWN, NOT_RESPONDING...): shown offline.",
    )
    # The agent's credentials: the secret signs lease snapshots (HMAC), the token authenticates its
    # reports (only a hash is kept). Both are shown once, by `manage.py register_node`.
    lease_secret = models.CharField(max_length=128, default=_new_secret, editable=False)
    agent_token_hash = models.CharField(max_length=64, blank=True, editable=False)
    # The SHA-256 of the password of the node's own broker user (nodes/broker_users.py), in the form Redis
    # ACLs take (`#<hex>`), so the portal can re-create the user after Redis restarts without ever
    # keeping the password. Empty: the node's agent was given the portal's own broker URL.
    broker_password_hash = models.CharField(max_length=64, blank=True, editable=False)
    # That user's name, as the agent's BROKER_URL carries it: this portal's prefix and the node's name
    # (NODE_BROKER_USER_PREFIX), or ``node-<name>`` for a user made before portals had prefixes, which keeps
    # working until the node's credentials are issued again. Empty with the hash.
    broker_username = models.CharField(max_length=128, blank=True, editable=False)
    # Every snapshot sent to the node carries a higher version; the agent refuses older ones.
    lease_version = models.PositiveBigIntegerField(default=0, editable=False)
    # The idle power cap (docs/agent.md, "Power limits"): sent in every snapshot, applied by the agent.
    idle_power_limit_pct = models.PositiveSmallIntegerField(
        "idle power limit (%)",
        null=True,
        blank=True,
        validators=[MinValueValidator(IDLE_POWER_LIMIT_PCT_MIN), MaxValueValidator(IDLE_POWER_LIMIT_PCT_MAX)],
        help_text=f"Lower the power limit of every card no booking holds to this percent of its default limit "
        f"({IDLE_POWER_LIMIT_PCT_MIN}-{IDLE_POWER_LIMIT_PCT_MAX}; the card's own minimum at least); the agent puts "
        "the limit back before a booking opens the card. Empty: off.",
    )

    class Meta:
        ordering = ["name"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(idle_power_limit_pct__isnull=True)
                | models.Q(
                    idle_power_limit_pct__gte=IDLE_POWER_LIMIT_PCT_MIN,
                    idle_power_limit_pct__lte=IDLE_POWER_LIMIT_PCT_MAX,
                ),
                name="node_idle_power_limit_pct_range",
            ),
        ]

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
    # Set when the node's agent could not empty the GPU after a slot (an unkillable process): like a
    # drained Slurm node it takes no new bookings until an admin returns it to service.
    drained_at = models.DateTimeField(null=True, blank=True, editable=False)
    drain_reason = models.CharField(max_length=500, blank=True, editable=False)
    # A MIG slice points at the card it is carved from (docs/booking-rules.md, "MIG slices"); a card has none.
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.CASCADE, related_name="slices")
    # Cards: whether MIG is on (current and pending modes both, as the agent reports), and how many
    # compute slices the card has in MIG mode (7 on A100/H100): a slice's share of the card is its own
    # compute slices over these. Slices: the profile (e.g. "3g.40gb"), their compute slices, and their
    # GPU instance's placement in the card's memory slices, where no two slices of one card overlap.
    mig_mode = models.BooleanField("MIG mode", default=False, editable=False)
    profile = models.CharField(max_length=40, blank=True, editable=False, help_text="MIG profile, e.g. 3g.40gb.")
    compute_slices = models.PositiveSmallIntegerField(default=1, editable=False)
    placement_start = models.PositiveSmallIntegerField(default=0, editable=False)
    placement_size = models.PositiveSmallIntegerField(default=1, editable=False)
    # A slice its agent no longer reports (the layout changed): kept for the bookings that name it, not bookable.
    gone_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Cards: how many memory slices the card has in MIG mode (8 on A100/H100), the range its slices' placements
    # lie in; None: not recorded yet (cards confirmed before the portal kept it; nodes/mig.py).
    memory_slices = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    # What the agent reports that differs from the confirmed values above, waiting for an admin
    # (nodes/mig.py, mig_layout_confirm). Limits, fair share and energy count by the confirmed values only, so
    # a report cannot change what a slice counts for. A card: its MIG mode and numbers, and since when they
    # differ (``mig_change_at``; while set, neither the card nor its slices take bookings). A slice: its
    # compute slices (``reported_compute_slices``; the slice waits too, not bookable).
    reported_mig_mode = models.BooleanField("reported MIG mode", null=True, blank=True, editable=False)
    reported_compute_slices = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    reported_memory_slices = models.PositiveSmallIntegerField(null=True, blank=True, editable=False)
    mig_change_at = models.DateTimeField("MIG change reported at", null=True, blank=True, editable=False)

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
        if self.parent_id is not None:
            return f"{self.node.name}/GPU {self.index} slice {self.profile}@{self.placement_start}"
        return f"{self.node.name}/GPU {self.index}"

    @property
    def memory_gb(self) -> int:
        return mib_to_gb(self.memory_mib)

    @property
    def is_slice(self) -> bool:
        return self.parent_id is not None

    @property
    def card_id(self) -> int:
        """The physical card: a slice's parent, or the GPU itself."""
        return self.parent_id if self.parent_id is not None else self.pk

    @property
    def placement(self) -> tuple[int, int]:
        """The part of its card this unit occupies, as a half-open range of memory slices. A whole card
        spans them all (and more: WHOLE_CARD), so it overlaps every slice of it, whatever the layout."""
        if self.parent_id is None:
            return (0, WHOLE_CARD)
        return (self.placement_start, self.placement_start + self.placement_size)

    def share_of(self, card: Gpu | None) -> Fraction:
        """What this unit counts as in limits and reports: 1 for a card, compute slices over the card's
        for a slice (a 3g.40gb of a 7-slice card is 3/7). ``card`` is the parent, given by the caller
        that has it at hand."""
        if self.parent_id is None:
            return Fraction(1)
        if card is None or card.pk != self.parent_id:
            raise ValueError(f"{self} needs its card to tell its share")
        return card_share(self.compute_slices, card.compute_slices)

    @property
    def is_bookable(self) -> bool:
        return self.bookable and self.drained_at is None and self.mig_change_at is None and self.gone_at is None


def card_share(unit_slices: int, card_slices: int | None) -> Fraction:
    """What a bookable unit counts as in GPUs, from its compute slices and its card's: 1 for a card (it
    has no card above it: ``card_slices`` None), its compute slices over its card's for a MIG slice (a
    3g.40gb of a 7-slice card is 3/7), never more than a whole card. Limits, reports, the status cards,
    the calendar and /metrics all count by this."""
    if card_slices is None:
        return Fraction(1)
    return Fraction(unit_slices, max(card_slices, unit_slices))


def mib_to_gb(mib: int) -> int:
    """A card's memory as pages and feeds show it: MiB rounded to whole GB (GiB)."""
    return round(mib / 1024)


def memory_gb_to_mib(gb: int | None) -> int | None:
    """A memory floor asked in GB, in MiB. Vendors count GB in powers of ten: a "24 GB" card
    reports 24564 MiB, under 24 * 1024, and must still match min_memory_gb=24."""
    return None if gb is None else gb * 1000**3 // 1024**2


def cuda_visible_devices(gpus: list[Gpu]) -> str:
    """What a job on the node sets CUDA_VISIBLE_DEVICES to for these GPUs. UUIDs, not indices:
    CUDA's own numbering need not match nvidia-smi's; UUIDs always do."""
    return ",".join(gpu.uuid for gpu in gpus)


# GPUs that take new bookings, as a filter (the queryset twin of Gpu.is_bookable).
BOOKABLE_GPUS = models.Q(bookable=True, drained_at__isnull=True, mig_change_at__isnull=True, gone_at__isnull=True)

# Beyond any card's memory slices (8 on today's MIG cards): the placement a whole-card booking covers.
WHOLE_CARD = 64


class AgentState(models.Model):
    """The latest heartbeat of a node's agent: is it alive, what has it applied, which ACLs are in force."""

    node = models.OneToOneField(Node, on_delete=models.CASCADE, primary_key=True, related_name="agent_state")
    last_seen = models.DateTimeField(db_index=True)
    agent_version = models.CharField(max_length=40, blank=True)
    backend = models.CharField(max_length=20, blank=True)
    driver_version = models.CharField(max_length=40, blank=True)
    reported_hostname = models.CharField(max_length=253, blank=True)
    applied_version = models.PositiveBigIntegerField(default=0)
    acls = models.JSONField(
        default=dict, help_text="GPU or MIG slice UUID -> users holding an ACL on every file it needs."
    )
    drained = models.JSONField(default=list)
    clock_skew_seconds = models.FloatField(null=True, help_text="Agent clock minus portal clock, at the heartbeat.")
    offline_since = models.DateTimeField(
        null=True, blank=True, help_text="When the agent was found silent; cleared when it reports again."
    )
    # The node's event budget (NODE_EVENTS_PER_MINUTE, nodes/ingest.py): events stored in the
    # current minute of the portal's clock, and every event counted but not stored past it.
    events_minute = models.DateTimeField(null=True, blank=True, editable=False)
    events_in_minute = models.PositiveIntegerField(default=0, editable=False)
    events_dropped = models.PositiveBigIntegerField(
        default=0, help_text="Events past the per-minute budget (NODE_EVENTS_PER_MINUTE): counted, not stored."
    )
    events_dropped_at = models.DateTimeField(null=True, blank=True, help_text="When events were last dropped.")

    class Meta:
        verbose_name = "agent state"

    def __str__(self) -> str:
        return f"agent on {self.node_id}"


class GpuTelemetry(models.Model):
    """The latest telemetry reading of one GPU; None means the card or driver does not report it."""

    gpu = models.OneToOneField(Gpu, on_delete=models.CASCADE, primary_key=True, related_name="telemetry")
    at = models.DateTimeField()
    utilization_pct = models.PositiveSmallIntegerField(null=True)
    memory_used_mib = models.PositiveIntegerField(null=True)
    memory_total_mib = models.PositiveIntegerField(null=True)
    temperature_c = models.SmallIntegerField(null=True)
    slowdown_temperature_c = models.SmallIntegerField(null=True)
    power_w = models.FloatField(null=True)
    ecc_errors_uncorrected = models.PositiveBigIntegerField(null=True)
    processes = models.JSONField(default=list, help_text="[{pid, user, used_memory_mib}]")
    energy_mj = models.PositiveBigIntegerField(
        null=True,
        help_text="The card's energy counter (mJ): grows until a driver reload or, estimated, an agent restart.",
    )
    energy_estimated = models.BooleanField(
        null=True, help_text="The counter is the card's power readings added up by the agent (the card keeps none)."
    )
    power_limit_w = models.FloatField(
        null=True, help_text="The card's power limit now (W): lower than its default while the idle power cap holds."
    )

    # The measured values, as agents report them and pages show them (processes aside).
    READINGS = (
        "utilization_pct",
        "memory_used_mib",
        "memory_total_mib",
        "temperature_c",
        "slowdown_temperature_c",
        "power_w",
        "ecc_errors_uncorrected",
        "energy_mj",
        "energy_estimated",
        "power_limit_w",
    )

    class Meta:
        verbose_name = "GPU telemetry"
        verbose_name_plural = "GPU telemetry"

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.at:%Y-%m-%d %H:%M:%S}"


class GpuMinute(models.Model):
    """Telemetry down-sampled to one row per GPU per minute (nodes/usage.py): what a slot's usage
    summary, idle detection and usage reports read. Kept TELEMETRY_MINUTES_KEEP_DAYS. A minute between two
    readings far apart may have energy and no sample (``samples`` 0: nodes/energy.py spreads the energy)."""

    gpu = models.ForeignKey(Gpu, on_delete=models.CASCADE, related_name="+")
    minute = models.DateTimeField(help_text="The minute (UTC) the samples fell in.")
    samples = models.PositiveIntegerField(default=0)
    utilization_samples = models.PositiveIntegerField(default=0, help_text="Samples that had a utilisation.")
    utilization_sum = models.PositiveIntegerField(default=0)
    memory_used_max_mib = models.PositiveIntegerField(null=True)
    temperature_max_c = models.SmallIntegerField(null=True)
    energy_mj = models.PositiveBigIntegerField(
        null=True, help_text="Energy used in the minute, from the card's counter (nodes/energy.py)."
    )
    energy_estimated = models.BooleanField(
        default=False, help_text="Part of the minute's energy is estimated: a counter reset, a gap, no counter."
    )

    class Meta:
        verbose_name = "GPU minute"
        constraints = [models.UniqueConstraint(fields=["gpu", "minute"], name="gpu_minute_unique")]
        indexes = [models.Index(fields=["minute"])]

    def __str__(self) -> str:
        return f"GPU {self.gpu_id} at {self.minute:%Y-%m-%d %H:%M}"


class NodeEvent(models.Model):
    """Something the agent did or saw: grants, revocations, leftovers, violations, refusals."""

    class Kind(models.TextChoices):
        SNAPSHOT_APPLIED = "snapshot_applied", "Snapshot applied"
        SNAPSHOT_REFUSED = "snapshot_refused", "Snapshot refused"
        GRANTED = "granted", "Access granted"
        REVOKED = "revoked", "Access revoked"
        GRANT_FAILED = "grant_failed", "Grant failed"
        REVOKE_FAILED = "revoke_failed", "Revoke failed"
        ACL_ERROR = "acl_error", "ACL unreadable"
        STORE_FAILED = "store_failed", "Snapshot not stored on disk"
        UNKNOWN_GPU = "unknown_gpu", "Unknown GPU in a lease"
        LEFTOVER = "leftover", "Leftover processes found"
        ENDED = "ended", "Leftover processes ended"
        UNKILLABLE = "unkillable", "Processes could not be ended"
        DRAIN_CLEARED = "drain_cleared", "GPU emptied after all"
        VIOLATION = "violation", "Use without a booking"
        LEASE_REFUSED = (
            "lease_refused",
            "Lease refused (no such ordinary account, or a MIG slice's card not in MIG mode)",
        )
        POWER_CAPPED = "power_capped", "Power limit lowered (no booking)"
        POWER_RESTORED = "power_restored", "Power limit given back"
        POWER_FAILED = "power_failed", "Power limit not changed"
        LAUNCH_STARTED = "launch_started", "Environment started"
        LAUNCH_EXITED = "launch_exited", "Environment exited"
        LAUNCH_STOPPED = "launch_stopped", "Environment stopped"
        LAUNCH_REFUSED = "launch_refused", "Environment refused"

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="events")
    gpu = models.ForeignKey(Gpu, on_delete=models.SET_NULL, null=True, blank=True, related_name="events")
    kind = models.CharField(max_length=20, choices=Kind.choices)
    at = models.DateTimeField(help_text="When it happened, by the agent's clock.")
    received_at = models.DateTimeField(auto_now_add=True)
    user = models.CharField(max_length=32, blank=True)
    reservation_id = models.BigIntegerField(null=True, blank=True)
    message = models.TextField(blank=True)
    details = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [
            models.Index(fields=["node", "-at"]),
            models.Index(fields=["kind", "-at"]),
            # The prune (NODE_EVENTS_KEEP_DAYS) goes by the portal's clock, not the agent's.
            models.Index(fields=["received_at"], name="nodeevent_received_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.node_id}: {self.get_kind_display()} at {self.at:%Y-%m-%d %H:%M:%S}"


class IngestMark(models.Model):
    """How far a consumer of a Redis stream has come (nodes/telemetry_queue.py): the id of the last entry
    whose writes have committed, updated in the same transaction as those writes. An entry at or before
    it is never stored twice, whatever happened to the consumer between its commit and Redis."""

    stream = models.CharField(max_length=100, primary_key=True)
    last_id = models.CharField(max_length=40, blank=True)

    def __str__(self) -> str:
        return f"{self.stream} up to {self.last_id or 'nothing'}"
