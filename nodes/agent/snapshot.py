"""Checking a lease snapshot before the agent believes it.

A snapshot is accepted only whole: signed with this node's secret, addressed to this node,
and with every lease well formed (a valid username, GPU UUIDs, aware times, end after start).
One bad lease refuses the lot: a signed snapshot with hostile content means something upstream
is wrong, and the safe answer is to keep enforcing the last good one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from nodes.agent.signing import verify
from nodes.agent.usernames import valid_username

GPU_UUID_RE = re.compile(r"\A(GPU|MIG)-[0-9a-fA-F-]{8,64}\Z")


class SnapshotRefused(ValueError):
    """The snapshot is not applied; the message says why (it is reported to the portal)."""


@dataclass(frozen=True)
class Lease:
    reservation: int
    user: str
    gpus: tuple[str, ...]
    start: datetime
    end: datetime

    def active_at(self, moment: datetime) -> bool:
        return self.start <= moment < self.end


@dataclass(frozen=True)
class Snapshot:
    node: str
    version: int
    issued_at: datetime
    leases: tuple[Lease, ...]
    raw: dict[str, Any]


def parse_snapshot(raw: Any, *, node_name: str, secret: str) -> Snapshot:
    """The verified snapshot, or SnapshotRefused naming the first thing wrong with it."""
    if not isinstance(raw, dict):
        raise SnapshotRefused("not a snapshot object")
    if not verify(raw, secret):
        raise SnapshotRefused("bad or missing signature")
    if raw.get("node") != node_name:
        raise SnapshotRefused(f"addressed to node {raw.get('node')!r}, this is {node_name!r}")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SnapshotRefused(f"bad version {version!r}")
    issued_at = _aware(raw.get("issued_at"), "issued_at")
    leases = raw.get("leases")
    if not isinstance(leases, list):
        raise SnapshotRefused("leases must be a list")
    return Snapshot(
        node=node_name,
        version=version,
        issued_at=issued_at,
        leases=tuple(_lease(item, position) for position, item in enumerate(leases)),
        raw=raw,
    )


def _lease(item: Any, position: int) -> Lease:
    where = f"lease {position}"
    if not isinstance(item, dict):
        raise SnapshotRefused(f"{where}: not an object")
    reservation = item.get("reservation")
    if not isinstance(reservation, int) or isinstance(reservation, bool) or reservation < 1:
        raise SnapshotRefused(f"{where}: bad reservation id {reservation!r}")
    user = item.get("user")
    if not valid_username(user):
        raise SnapshotRefused(f"{where}: refused username {user!r}")
    gpus = item.get("gpus")
    if not isinstance(gpus, list) or not gpus or not all(isinstance(g, str) and GPU_UUID_RE.match(g) for g in gpus):
        raise SnapshotRefused(f"{where}: refused GPU list {gpus!r}")
    start, end = _aware(item.get("start"), f"{where} start"), _aware(item.get("end"), f"{where} end")
    if end <= start:
        raise SnapshotRefused(f"{where}: ends before it starts")
    return Lease(reservation=reservation, user=user, gpus=tuple(gpus), start=start, end=end)


def _aware(value: Any, what: str) -> datetime:
    if not isinstance(value, str):
        raise SnapshotRefused(f"{what}: not a timestamp")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise SnapshotRefused(f"{what}: not an ISO 8601 timestamp") from None
    if moment.tzinfo is None:
        raise SnapshotRefused(f"{what}: timestamp without a time zone")
    return moment
