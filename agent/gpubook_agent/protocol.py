"""The wire protocol between the portal and its node agents: one module, imported by both sides.

What travels, and under which names: the Celery queue a node's snapshots are pushed on and the task
that carries them; the agent's HTTP endpoints on the portal; and the shape of every body, built here
where a body is built: the lease snapshot the portal signs (signing.py) and the agent checks
(snapshot.py), and the heartbeat, telemetry and event reports the agent posts and the portal validates
(nodes/ingest_serializers.py, whose fields the tests hold to the shapes below). Standard library only:
the portal imports it from this distribution, and the agent imports nothing of the portal.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import NotRequired, Required, TypedDict

from gpubook_agent import AGENT_VERSION

# -- the push: Celery ------------------------------------------------------------------------------

APPLY_SNAPSHOT_TASK = "gpubook.agent.apply_snapshot"


def queue_name(node_name: str) -> str:
    """The Celery queue the portal pushes ``node_name``'s snapshots to, and its agent consumes."""
    return f"node.{node_name}"


# -- the reports and the pull: HTTP, with the node's token -------------------------------------------

AGENT_API_PATH = "/api/v1/agent/"
HEARTBEAT, EVENTS, TELEMETRY, SNAPSHOT = "heartbeat", "events", "telemetry", "snapshot"


def agent_path(endpoint: str) -> str:
    """The path of one of the agent's endpoints below the portal's address: ``/api/v1/agent/<endpoint>/``."""
    return f"{AGENT_API_PATH}{endpoint}/"


# What the portal accepts in one report; the agent keeps within it, so one event never gets its whole batch
# refused.
MAX_GPUS = 256
EVENTS_PER_POST = 500
MAX_PIDS = 1000
TEXT_LIMITS = {"user": 32, "message": 2000, "process": 64}
BACKENDS = ("nvml", "simulated")
# Every kind of event an agent reports (the portal stores each as a NodeEvent.Kind).
EVENT_KINDS = (
    "snapshot_applied",
    "snapshot_refused",
    "granted",
    "revoked",
    "grant_failed",
    "revoke_failed",
    "acl_error",
    "store_failed",
    "unknown_gpu",
    "leftover",
    "ended",
    "unkillable",
    "drain_cleared",
    "violation",
    "lease_refused",
    "power_capped",
    "power_restored",
    "power_failed",
    "launch_started",
    "launch_exited",
    "launch_stopped",
    "launch_refused",
)
# The idle power cap (the portal's Node.idle_power_limit_pct, the agent's power.py): a card no lease holds is
# limited to this share of its default power limit, a whole percent in this range (clamped to what the card
# allows). Both sides check it: the portal when an admin sets it, the agent when a snapshot brings it.
IDLE_POWER_LIMIT_PCT_MIN, IDLE_POWER_LIMIT_PCT_MAX = 10, 100

# A booking's environment runs a command from an argument list, never a shell (issue 22): the portal checks an
# admin's command when it is saved (environments.Environment), the agent again before it runs one (launcher.py).
MAX_ARGS, MAX_ARG_CHARS = 64, 4096


def argv_problem(argv: object) -> str | None:
    """Why ``argv`` is not a command the agent runs, in words; None when it is one."""
    if not isinstance(argv, list | tuple) or not 1 <= len(argv) <= MAX_ARGS:
        return f"a command is a list of 1 to {MAX_ARGS} arguments"
    if any(not isinstance(arg, str) or not arg or "\0" in arg or len(arg) > MAX_ARG_CHARS for arg in argv):
        return f"each argument is text of 1 to {MAX_ARG_CHARS} characters, without NUL"
    return None


# What a lease may launch (issue 22): an environment the admins listed, a container (rootless podman) or a
# plain command, at most MAX_LAUNCHES per lease; on the node each is named launch_name(reservation, number). In
# its command, SOCKET_PLACEHOLDER stands for the path of a Unix socket in a directory only the lease's user can
# enter (issue 36: no other account on the node can take or reach it), PORT_PLACEHOLDER for a free port on the
# node's loopback (for commands that serve TCP only: any account can race for it, so the agent publishes it only
# once the launch's own processes hold its listener) and TOKEN_PLACEHOLDER for a fresh secret token; the agent
# picks them and reports them back (a notebook listens there and asks for the token).
LAUNCH_KINDS = ("container", "command")
MAX_LAUNCHES = 4
PORT_PLACEHOLDER, TOKEN_PLACEHOLDER, SOCKET_PLACEHOLDER = "{port}", "{token}", "{socket}"
# The most characters a launch's socket path may have on the node: a Unix socket's address holds 107 bytes and a
# NUL (sun_path), and ssh's -L names it on the holder's command line.
MAX_SOCKET_PATH_CHARS = 107
# A launch's socket path as reported: plain path characters only, since the portal prints it in an ssh command that
# its holder pastes into a shell.
SOCKET_PATH_RE = re.compile(r"\A(?:/[A-Za-z0-9._-]+)+\Z")
# What a launch is doing, as the agent reports it in each heartbeat ("waiting": its slot is yet to come, and the
# message says whether its image is on the node, pulled ahead of the start).
LAUNCH_STATES = ("waiting", "starting", "running", "exited", "stopped", "refused")
LAUNCH_TAIL_CHARS = 2000
MAX_LAUNCH_STATUSES = 256  # launches in one heartbeat
# An OCI image reference: [registry[:port]/]path[:tag][@sha256:digest], lower case path components. It never
# starts with "-", so it cannot pass for an option on podman's command line.
IMAGE_RE = re.compile(
    r"\A(?:[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?\Z"
)


def launch_name(reservation: int, number: int) -> str:
    """A launch's name on the node: its log's, its container's, its systemd unit's."""
    return f"gpubook-{reservation}-{number}"


# -- the bodies ----------------------------------------------------------------------------------------


class Lease(TypedDict):
    """One booking in a snapshot: who may open which GPUs, from when until when (ISO 8601, with a zone).

    Leases name GPUs by UUID: a whole card (``GPU-…``) or a MIG slice (``MIG-…``). A slice lease opens the
    parent card's device file and the slice's GPU-instance and compute-instance capability files to the
    user. When someone books a whole card that is in MIG mode, the portal lists every slice's UUID in the
    lease; a lease that names a card in MIG mode is equivalent for the agent, which grants the card's device
    file and the capability files of every slice the card has at that moment.
    """

    reservation: int
    user: str  # the unix username on the node
    gpus: list[str]  # GPU (or MIG) UUIDs
    start: str
    end: str
    launches: NotRequired[list[LaunchRequest]]  # left out when none (and by portals before issue 22)


class LaunchRequest(TypedDict):
    """An environment to run for the lease's user while the lease is active (issue 22): started once the lease's
    GPUs are open to them, ended at its end (after the grace) or when the portal stops listing it."""

    number: int  # 1, 2, ... within the reservation
    kind: str  # one of LAUNCH_KINDS
    image: str  # a container's image (IMAGE_RE); "" for a command
    argv: list[str]  # the command (argv_problem), run in the image for a container
    memory_max_bytes: int | None
    max_processes: int | None


class Snapshot(TypedDict):
    """A node's whole desired state, signed with its lease secret (signing.py adds ``signature``)."""

    node: str
    version: int  # higher than any issued to this node before
    issued_at: str
    horizon_end: str  # leases starting up to this moment are included
    leases: list[Lease]
    # The idle power cap, a percent of each card's default power limit (IDLE_POWER_LIMIT_PCT_MIN to _MAX); None:
    # off. Left out by portals before it (off); agents before it ignore it.
    idle_power_limit_pct: NotRequired[int | None]
    signature: NotRequired[str]


class MigSlice(TypedDict):
    """One MIG slice (a compute instance inside a GPU instance) as the agent found it on its card."""

    uuid: str  # "MIG-…", what leases name
    profile: str  # as nvidia-smi names it: "3g.40gb" (a compute instance smaller than its GPU instance: "1c.3g.40gb")
    gpu_instance_id: int
    compute_instance_id: int
    # Where the GPU instance sits on the card, in the card's memory slices (NVML's GPU-instance placement): two
    # slices whose ranges [start, start + size) overlap cannot both exist.
    placement_start: int
    placement_size: int
    compute_slices: int  # the 3 of 3g.40gb: this slice's share of the card's compute_slices
    memory_mib: int | None


class MigCard(TypedDict):
    """A card that supports MIG: its mode and the slices it has now (none while MIG is off)."""

    uuid: str  # the card's "GPU-…" UUID
    mode_current: bool  # MIG is on now
    mode_pending: bool  # MIG will be on after the next GPU reset: differs from mode_current while a change waits
    placement_slots: int  # memory slices of the card (8 on A100/H100): the range placements lie in
    compute_slices: int  # compute slices of the card (7 on A100/H100)
    slices: list[MigSlice]


class Heartbeat(TypedDict):
    """What the agent says every HEARTBEAT_SECONDS: who it is, what it enforces, what it has drained."""

    sent_at: str
    agent_version: str
    backend: str  # one of BACKENDS
    driver_version: str | None
    hostname: str
    applied_version: int  # the version of the snapshot it enforces, 0 for none
    # GPU or MIG UUID -> users it is open to: every file the UUID needs carries their ACL entry (a card's device
    # file; a slice's capability files, and its card's device file while the card's MIG mode allows it).
    acls: dict[str, list[str]]
    drained: NotRequired[list[str]]  # GPUs whose leftover processes could not be ended
    # Only the cards that support MIG, every heartbeat (the portal keeps slice rows up to date from it); left
    # out by agents older than MIG support, and a node without such cards sends an empty list.
    mig: NotRequired[list[MigCard]]
    launches: NotRequired[list[LaunchStatus]]  # left out by agents before issue 22


class LaunchStatus(TypedDict):
    """One launch the agent knows, in every heartbeat while it runs and for a while after (level-triggered, like
    ``acls``): the portal shows it on the booking."""

    reservation: int
    number: int
    state: str  # one of LAUNCH_STATES
    exit_code: int | None  # once it ended: its command's, negative for the signal that ended it
    message: str  # why it was refused, or how it ended, in words
    # Where it serves, once the agent has seen it serve there (its own processes hold the port's listener; its socket
    # exists, in its user's own directory): None / "" before that, and for a command that serves nothing.
    port: int | None  # the loopback port it was given ({port})
    token: str  # the token it was given ({token}, or with a port or socket); else "" (also until it serves)
    tail: str  # the end of its output, at most LAUNCH_TAIL_CHARS
    socket: NotRequired[str]  # the Unix socket's path on the node ({socket}); left out by agents before issue 36


class HeartbeatReply(TypedDict):
    """The portal's answer to a heartbeat."""

    portal_time: str
    lease_version: int  # the newest snapshot version issued to this node: an agent behind it pulls
    ignored_gpus: list[str]  # UUIDs in the heartbeat that are not this node's


class ProcessReading(TypedDict):
    pid: int
    used_memory_mib: int | None
    user: NotRequired[str | None]  # the owner's name, added by the agent from /proc


class GpuReading(TypedDict):
    """One GPU's telemetry sample; a measurement the card or driver did not give is None and named in
    ``missing``, so the portal can tell "not supported" from zero."""

    uuid: str
    utilization_pct: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    slowdown_temperature_c: int | None
    power_w: float | None
    ecc_errors_uncorrected: int | None
    processes: list[ProcessReading]
    missing: list[str]
    # Agents before energy reporting leave these out (the portal takes none then).
    energy_mj: NotRequired[int | None]
    energy_estimated: NotRequired[bool]
    # The card's power limit now (W), which the idle power cap lowers; None on a MIG slice (NVML gives it per
    # card). Agents before the cap leave it out.
    power_limit_w: NotRequired[float | None]


class Telemetry(TypedDict):
    sent_at: str
    gpus: list[GpuReading]


class Event(TypedDict, total=False):
    """Something the agent did or saw; ``kind`` and ``at`` always, the rest as the kind calls for."""

    kind: Required[str]  # one of EVENT_KINDS
    at: Required[str]
    gpu: str
    user: str | None
    reservation: int
    message: str
    pid: int
    pids: list[int]
    process: str | None
    version: int  # of the snapshot applied or refused
    leases: int  # how many the applied snapshot holds
    boundary: str  # the lease start or end behind a grant or a revocation
    drained: bool
    power_limit_w: float  # the limit a power_capped or power_restored event set (W)
    launch: int  # a launch_* event's launch number within ``reservation``
    exit_code: int  # how a launch's command ended


class Events(TypedDict):
    events: list[dict[str, object]]  # each an Event, at most EVENTS_PER_POST


# -- building them ---------------------------------------------------------------------------------------


def timestamp(moment: datetime | None = None) -> str:
    """A moment as the protocol writes it: ISO 8601 with its zone; now (UTC) by default."""
    return (moment or datetime.now(UTC)).isoformat()


def lease(
    *,
    reservation: int,
    user: str,
    gpus: Iterable[str],
    start: datetime,
    end: datetime,
    launches: Iterable[LaunchRequest] = (),
) -> Lease:
    body: Lease = {
        "reservation": reservation,
        "user": user,
        "gpus": list(gpus),
        "start": start.isoformat(),
        "end": end.isoformat(),
    }
    if launches:
        body["launches"] = list(launches)
    return body


def launch_request(
    *,
    number: int,
    kind: str,
    image: str,
    argv: Iterable[str],
    memory_max_bytes: int | None = None,
    max_processes: int | None = None,
) -> LaunchRequest:
    return {
        "number": number,
        "kind": kind,
        "image": image,
        "argv": list(argv),
        "memory_max_bytes": memory_max_bytes,
        "max_processes": max_processes,
    }


def launch_problem(request: object) -> str | None:
    """Why ``request`` is not a launch the agent runs, in words; None when it is one. The portal builds only good
    ones; the agent checks again, and refuses that launch alone (not its lease, nor the snapshot)."""
    if not isinstance(request, dict):
        return "a launch is an object"
    number = request.get("number")
    if not isinstance(number, int) or isinstance(number, bool) or not 1 <= number <= 10**6:
        return f"bad launch number {number!r}"
    kind, image = request.get("kind"), request.get("image")
    if kind not in LAUNCH_KINDS:
        return f"unknown kind {kind!r}"
    if kind == "container" and not (isinstance(image, str) and IMAGE_RE.match(image)):
        return f"bad image {image!r}"
    if kind == "command" and image != "":
        return "a command runs no image"
    for limit in ("memory_max_bytes", "max_processes"):
        value = request.get(limit)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            return f"{limit} must be a positive whole number"
    return argv_problem(request.get("argv"))


def snapshot(
    *,
    node: str,
    version: int,
    issued_at: datetime,
    horizon_end: datetime,
    leases: list[Lease],
    idle_power_limit_pct: int | None = None,
) -> Snapshot:
    """The unsigned snapshot (signing.signed adds the signature)."""
    return {
        "node": node,
        "version": version,
        "issued_at": issued_at.isoformat(),
        "horizon_end": horizon_end.isoformat(),
        "leases": leases,
        "idle_power_limit_pct": idle_power_limit_pct,
    }


def snapshot_message(signed_snapshot: Mapping[str, object]) -> str:
    """What a push carries as its one argument: the signed snapshot as one compact JSON string, so that the
    agent parses it itself within its own size and nesting limits (kombu would parse an object first)."""
    return json.dumps(signed_snapshot, separators=(",", ":"))


def heartbeat(
    *,
    backend: str,
    driver_version: str | None,
    applied_version: int,
    acls: Mapping[str, Iterable[str]],
    drained: Iterable[str] | None = None,
    mig: Iterable[MigCard] | None = None,
    launches: Iterable[LaunchStatus] | None = None,
    sent_at: datetime | None = None,
) -> Heartbeat:
    """A heartbeat from this host, sent now unless ``sent_at`` says otherwise. ``drained`` is left out
    when not given (the self-check, which has no enforcer's memory to read it from); the portal takes
    a heartbeat without it as draining nothing. ``mig`` (see ``mig_card``) and ``launches`` are left out when
    not given."""
    body: Heartbeat = {
        "sent_at": timestamp(sent_at),
        "agent_version": AGENT_VERSION,
        "backend": backend,
        "driver_version": driver_version,
        "hostname": socket.gethostname(),
        "applied_version": applied_version,
        "acls": {uuid: list(users) for uuid, users in acls.items()},
    }
    if drained is not None:
        body["drained"] = sorted(drained)
    if mig is not None:
        body["mig"] = list(mig)
    if launches is not None:
        body["launches"] = list(launches)
    return body


def mig_slice(
    *,
    uuid: str,
    profile: str,
    gpu_instance_id: int,
    compute_instance_id: int,
    placement_start: int,
    placement_size: int,
    compute_slices: int,
    memory_mib: int | None,
) -> MigSlice:
    return {
        "uuid": uuid,
        "profile": profile,
        "gpu_instance_id": gpu_instance_id,
        "compute_instance_id": compute_instance_id,
        "placement_start": placement_start,
        "placement_size": placement_size,
        "compute_slices": compute_slices,
        "memory_mib": memory_mib,
    }


def mig_card(
    *,
    uuid: str,
    mode_current: bool,
    mode_pending: bool,
    placement_slots: int,
    compute_slices: int,
    slices: Iterable[MigSlice],
) -> MigCard:
    """One card's entry in the heartbeat's ``mig``; its slices ordered by placement, as on the card."""
    return {
        "uuid": uuid,
        "mode_current": mode_current,
        "mode_pending": mode_pending,
        "placement_slots": placement_slots,
        "compute_slices": compute_slices,
        "slices": sorted(slices, key=lambda s: (s["placement_start"], s["gpu_instance_id"], s["compute_instance_id"])),
    }


def telemetry(gpus: list[GpuReading], *, sent_at: datetime | None = None) -> Telemetry:
    return {"sent_at": timestamp(sent_at), "gpus": gpus}


def event(kind: str, fields: Mapping[str, object], *, at: datetime | None = None) -> dict[str, object]:
    """One event (see ``Event``) with these ``fields``, happening now unless ``at`` says otherwise. Fields
    that are None are left out; a pid list and texts are cut to what the portal accepts (a text cut short
    ends in "…")."""
    record: dict[str, object] = {
        "kind": kind,
        "at": timestamp(at),
        **{key: value for key, value in fields.items() if value is not None},
    }
    pids = record.get("pids")
    if isinstance(pids, list) and len(pids) > MAX_PIDS:
        record["pids"] = pids[:MAX_PIDS]
    for key, limit in TEXT_LIMITS.items():
        text = record.get(key)
        if isinstance(text, str) and len(text) > limit:
            record[key] = text[: limit - 1] + "…"
    return record


def events(batch: list[dict[str, object]]) -> Events:
    return {"events": batch}
