"""Talking to a Slurm cluster's controller through ``scontrol`` (issue 23): reading its nodes and reservations,
creating, updating and deleting the portal's reservations.

The command is SLURM_SCONTROL from the settings, an argument list (``scontrol``, or ``ssh -- slurm-ctl scontrol``
for a controller elsewhere): every call appends its own arguments, never through a shell. ``scontrol``'s one-line
output (``-o``) is ``Key=Value`` pairs separated by spaces, where a value may itself hold spaces (a node's ``OS=``):
a key is a word followed by ``=`` after a space, and its value runs to the next key.

Only reservations named with RESERVATION_PREFIX are the portal's: nothing here changes another.
"""

from __future__ import annotations

import os
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


class SlurmInUse(SlurmError):
    """Slurm refused to delete a reservation that jobs use (running, or pending in it): ESLURM_RESERVATION_BUSY."""


# How scontrol says it never reached the controller (src/common/slurm_protocol_api.c's words, 22.05 on).
UNREACHABLE_WORDS = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted")
IN_USE_WORDS = ("Requested reservation is in use",)  # slurm_errno.c, ESLURM_RESERVATION_BUSY
SSH_FAILED = 255  # ssh's own exit status when it could not connect or log in (ssh(1)); scontrol never exits so
# One TRES of a reservation: ``gres/gpu:a100=2``, ``gres/gpu=2``, ``cpu=4``.
TRES_RE = re.compile(r"\A([a-z]+)(?:/([A-Za-z0-9_.:-]+))?=([0-9]+)\Z")
GRES_TYPE_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")  # a GPU type as the portal keeps it and sends it back
JOB_ID_RE = re.compile(r"\A[0-9]{1,12}\Z")


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
# Of those, the states in which the node is gone rather than taken out of service (drained): shown offline.
DOWN_STATES = frozenset({"DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN"})
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
    def down(self) -> bool:
        return any(part.rstrip("*") in DOWN_STATES for part in self.state.split("+"))

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
        return is_ours(self.name)


def node_from(record: dict[str, str]) -> SlurmNode:
    gpu_type, count = "", 0
    for gres in record.get("Gres", "").split(","):
        parts = gres.split("(")[0].split(":")  # gpu:a100:4(S:0-1) -> gpu, a100, 4
        if parts[0] == "gpu" and parts[-1].isdigit():
            count += int(parts[-1])
            gpu_type = parts[1] if len(parts) == 3 and GRES_TYPE_RE.match(parts[1]) else gpu_type
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
            if any(phrase in said for phrase in UNREACHABLE_WORDS) or (
                done.returncode == SSH_FAILED and os.path.basename(self.command[0]) == "ssh"
            ):
                raise SlurmUnreachable(said)
            if any(phrase in said for phrase in IN_USE_WORDS):
                raise SlurmInUse(said)
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
        found = []
        for record in parse_records(output):
            name = record.get("ReservationName", "")
            try:
                found.append(reservation_from(record))
            except (KeyError, ValueError):
                if is_ours(name):
                    raise SlurmError(f"scontrol described {name} in a way the portal cannot read") from None
                # An operator's the portal cannot read (a time it does not parse): not the portal's business.
        return found

    def create(self, reservation: SlurmReservation) -> None:
        self.run("create", "reservation", *_settings(reservation))

    def update(self, reservation: SlurmReservation) -> None:
        # Flags are not updated: ours are set once at creation (MAGNETIC), and an update cannot drop SPEC_NODES.
        # Nor is a start that has come: Slurm cannot move a started reservation's start.
        check_reservation(reservation)
        start = [f"StartTime={slurm_timestamp(reservation.start)}"] if reservation.start > datetime.now(UTC) else []
        self.run(
            "update",
            f"ReservationName={reservation.name}",
            *start,
            f"EndTime={slurm_timestamp(reservation.end)}",
            f"Users={','.join(reservation.users)}",
        )

    def delete(self, name: str) -> None:
        if not is_ours(name):
            raise SlurmError(f"{name!r} is not a reservation of the portal's: never deleted")
        self.run("delete", f"ReservationName={name}")

    def release_jobs(self, name: str) -> list[str]:
        """Take the jobs waiting in one of the portal's reservations out of it (they stay queued, as any other job
        of theirs), so that it can be deleted; returns their ids. Running jobs are left alone."""
        if not is_ours(name):
            raise SlurmError(f"{name!r} is not a reservation of the portal's: its jobs are not moved")
        waiting = [
            record["JobId"]
            for record in parse_records(self.run("show", "job", "-o"))
            if record.get("Reservation") == name
            and record.get("JobState") == "PENDING"
            and JOB_ID_RE.match(record.get("JobId", ""))
        ]
        for job_id in waiting:
            self.run("update", f"JobId={job_id}", "ReservationName=")
        return waiting


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


def is_ours(name: str) -> bool:
    """``gpubook-<booking id>``: the portal's; any other name (``gpubook-x`` too) is someone else's."""
    number = name.removeprefix(RESERVATION_PREFIX)
    return name.startswith(RESERVATION_PREFIX) and number.isascii() and number.isdigit() and len(number) < 19


def check_reservation(reservation: SlurmReservation) -> None:
    """Every value goes into one ``Key=value`` argument: none may hold a space, a comma where one does not belong,
    or start a new key; names come from the portal's own validated data, this is the last look. The TRES (a GRES
    type read from Slurm) is held to ``gres/gpu:<type>=<n>`` items."""
    words = [reservation.name, *reservation.nodes.split(","), *reservation.users, *reservation.flags]
    bad_tres = reservation.tres and not all(TRES_RE.match(part) for part in reservation.tres.split(","))
    if not is_ours(reservation.name) or any(not NAME_RE.match(word) for word in words) or bad_tres:
        raise SlurmError(f"refused to send Slurm a reservation with {[*words, reservation.tres]!r}")
