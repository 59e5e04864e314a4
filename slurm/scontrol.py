"""Talking to a Slurm cluster's controller through ``scontrol`` (issue 23): reading its nodes and reservations,
creating, updating and deleting the portal's reservations.

The command is SLURM_SCONTROL from the settings, an argument list (``scontrol``, or ``ssh -- slurm-ctl scontrol``
for a controller elsewhere): every call appends its own arguments, never through a shell. ``scontrol``'s one-line
output (``-o``) is ``Key=Value`` pairs separated by spaces, where a value may itself hold spaces (a node's ``OS=``):
a key is a word followed by ``=`` after a space, and its value runs to the next key.

Only reservations named with RESERVATION_PREFIX are the portal's: nothing here changes another.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from slurm.controller import Capabilities, parse_version

RESERVATION_PREFIX = "gpubook-"
# A key starts the text or follows a space: a word of letters, digits, ``_`` or ``:`` and then ``=``.
KEY_RE = re.compile(r"(?:^|(?<= ))([A-Za-z][A-Za-z0-9_:]*)=")
NAME_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
TIMEOUT_SECONDS = 30.0


class SlurmError(Exception):
    """scontrol failed or refused: the message is Slurm's own words (or why it could not be run)."""


class SlurmUnreachable(SlurmError):
    """The controller could not be asked at all (not installed, no answer, connection refused): nothing was
    decided, unlike a refusal. A reconcile pass stops there rather than record refusals that were not."""


# How scontrol says it never reached the controller (src/common/slurm_protocol_api.c's words, 22.05 on).
UNREACHABLE_WORDS = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted")


def parse_line(line: str) -> dict[str, str]:
    """One record of ``scontrol show ... -o``."""
    keys = list(KEY_RE.finditer(line))
    record = {}
    for index, key in enumerate(keys):
        end = keys[index + 1].start() if index + 1 < len(keys) else len(line)
        record[key.group(1)] = line[key.end() : end].strip()
    return record


def parse_records(text: str) -> list[dict[str, str]]:
    return [parse_line(line) for line in text.splitlines() if line.strip() and "=" in line]


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``: one ``Key = value`` per line (spaces around ``=``)."""
    config = {}
    for line in text.splitlines():
        key, equals, value = line.partition("=")
        if equals and key.strip() and " " not in key.strip():
            config[key.strip()] = value.strip()
    return config


# Node states (or flags: IDLE+DRAIN) in which a node runs no new jobs.
# ``show node`` says MAINTENANCE (node_state_flags[], src/common/slurm_protocol_defs.c); sinfo says MAINT.
OFFLINE_STATES = frozenset(
    {"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "NOT_RESPONDING", "MAINT", "MAINTENANCE"}
)


@dataclass(frozen=True)
class SlurmNode:
    name: str
    hostname: str
    state: str  # as Slurm says it: IDLE, MIXED, ALLOCATED, DOWN, and flags after "+": IDLE+DRAIN
    gpu_type: str  # from Gres=gpu:<type>:<count>; "" when the GRES names no type
    gpu_count: int
    reason: str

    @property
    def offline(self) -> bool:
        return any(part.rstrip("*") in OFFLINE_STATES for part in self.state.split("+"))

    @property
    def described(self) -> str:
        """Its state as people read it on the calendar and status page: ``IDLE+DRAIN: new disk``."""
        return f"{self.state}: {self.reason}" if self.reason else self.state


@dataclass(frozen=True)
class SlurmReservation:
    name: str
    users: tuple[str, ...]
    start: datetime
    end: datetime
    nodes: str
    flags: tuple[str, ...]
    tres: str

    @property
    def is_ours(self) -> bool:
        return self.name.startswith(RESERVATION_PREFIX)


def node_from(record: dict[str, str]) -> SlurmNode:
    gpu_type, count = "", 0
    for gres in record.get("Gres", "").split(","):
        parts = gres.split("(")[0].split(":")  # gpu:a100:4(S:0-1) -> gpu, a100, 4
        if parts[0] == "gpu" and parts[-1].isdigit():
            count += int(parts[-1])
            gpu_type = parts[1] if len(parts) == 3 else gpu_type
    state = record.get("State", "UNKNOWN")
    return SlurmNode(
        name=record["NodeName"],
        hostname=record.get("NodeHostName") or record["NodeName"],
        state=state,
        gpu_type=gpu_type,
        gpu_count=count,
        reason=record.get("Reason", ""),
    )


def reservation_from(record: dict[str, str]) -> SlurmReservation:
    users = record.get("Users", "(null)")
    return SlurmReservation(
        name=record["ReservationName"],
        users=() if users in ("(null)", "") else tuple(users.split(",")),
        start=slurm_time(record["StartTime"]),
        end=slurm_time(record["EndTime"]),
        nodes=record.get("Nodes", ""),
        flags=tuple(flag for flag in record.get("Flags", "").split(",") if flag and flag != "(null)"),
        tres=record.get("TRES", ""),
    )


def slurm_time(text: str) -> datetime:
    """Slurm's times (``2026-12-06T06:50:59``) are the controller's local time; the test and production
    controllers here run in UTC (the portal's docs say to, for the calendar to match)."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def slurm_timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


class Scontrol:
    """``scontrol`` as configured: ``command`` is the argument list that runs it."""

    def __init__(self, command: Sequence[str], *, timeout: float = TIMEOUT_SECONDS) -> None:
        self.command = list(command)
        self.timeout = timeout

    def run(self, *arguments: str) -> str:
        try:
            done = subprocess.run(  # noqa: S603 - an argument list from the settings, then our own arguments
                [*self.command, *arguments], capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except FileNotFoundError:
            raise SlurmUnreachable(f"{self.command[0]} is not installed here (SLURM_SCONTROL)") from None
        except subprocess.TimeoutExpired:
            raise SlurmUnreachable(f"the Slurm controller did not answer within {self.timeout:.0f} s") from None
        if done.returncode != 0:
            words = (done.stderr.strip() or done.stdout.strip() or f"exit status {done.returncode}").splitlines()
            said = words[-1][:500]
            if any(phrase in said for phrase in UNREACHABLE_WORDS):
                raise SlurmUnreachable(said)
            raise SlurmError(said)
        return done.stdout

    def capabilities(self) -> Capabilities:
        """The release of the cluster's Slurm, as its controller reports it (``scontrol show config``: the
        client's own ``--version`` could be older or newer than the controller's)."""
        config = parse_config(self.run("show", "config"))
        version = parse_version(config.get("SLURM_VERSION", ""))
        if version is None:
            raise SlurmError("scontrol show config names no SLURM_VERSION")
        return Capabilities(version=version, api="scontrol")

    def nodes(self) -> list[SlurmNode]:
        return [node_from(record) for record in parse_records(self.run("show", "node", "-o"))]

    def reservations(self) -> list[SlurmReservation]:
        output = self.run("show", "reservation", "-o")
        if output.strip().startswith("No reservations"):
            return []
        return [reservation_from(record) for record in parse_records(output) if "ReservationName" in record]

    def create(self, reservation: SlurmReservation) -> None:
        self.run("create", "reservation", *_settings(reservation))

    def update(self, reservation: SlurmReservation) -> None:
        # Flags are not updated: ours are set once at creation (MAGNETIC), and an update cannot drop SPEC_NODES.
        check_reservation(reservation)
        self.run(
            "update",
            f"ReservationName={reservation.name}",
            f"StartTime={slurm_timestamp(reservation.start)}",
            f"EndTime={slurm_timestamp(reservation.end)}",
            f"Users={','.join(reservation.users)}",
        )

    def delete(self, name: str) -> None:
        if not name.startswith(RESERVATION_PREFIX) or not NAME_RE.match(name):
            raise SlurmError(f"{name!r} is not a reservation of the portal's: never deleted")
        self.run("delete", f"ReservationName={name}")


def _settings(reservation: SlurmReservation) -> list[str]:
    check_reservation(reservation)
    settings = [
        f"ReservationName={reservation.name}",
        f"Users={','.join(reservation.users)}",
        f"StartTime={slurm_timestamp(reservation.start)}",
        f"EndTime={slurm_timestamp(reservation.end)}",
        f"Nodes={reservation.nodes}",
    ]
    if reservation.flags:
        settings.append(f"Flags={','.join(reservation.flags)}")
    if reservation.tres:
        settings.append(f"TRES={reservation.tres}")
    return settings


def check_reservation(reservation: SlurmReservation) -> None:
    """Every value goes into one ``Key=value`` argument: none may hold a space, a comma where one does not belong,
    or start a new key; names come from the portal's own validated data, this is the last look."""
    words = [reservation.name, *reservation.nodes.split(","), *reservation.users, *reservation.flags]
    if not reservation.name.startswith(RESERVATION_PREFIX) or any(not NAME_RE.match(word) for word in words):
        raise SlurmError(f"refused to send Slurm a reservation with {words!r}")
