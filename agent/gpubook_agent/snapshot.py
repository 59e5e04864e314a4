"""Checking a lease snapshot before the agent believes it.

A snapshot is accepted only whole: signed with this node's secret, addressed to this node,
with every lease well formed (a valid username, GPU UUIDs, aware times, end after start), and
its idle power cap, when it has one, a whole percent in the protocol's range.
One bad lease refuses the lot: a signed snapshot with hostile content means something upstream
is wrong, and the safe answer is to keep enforcing the last good one.

A snapshot arrives as JSON text (a push carries it as one string inside the Celery message, a pull
is the body of the portal's answer), so the agent itself bounds its size and nesting before it
parses it: whatever arrives is a snapshot or a ``SnapshotRefused``, never another exception.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import accumulate
from typing import Any

from gpubook_agent.protocol import (
    IDLE_POWER_LIMIT_PCT_MAX,
    IDLE_POWER_LIMIT_PCT_MIN,
    MAX_LAUNCHES,
    PORT_PLACEHOLDER,
    SOCKET_PLACEHOLDER,
    TOKEN_PLACEHOLDER,
    launch_problem,
)
from gpubook_agent.signing import verify
from gpubook_agent.usernames import valid_username

GPU_UUID_RE = re.compile(r"\A(GPU|MIG)-[0-9a-fA-F-]{8,64}\Z")
# A day of leases of a large node is a few hundred kB; what is bigger is refused before it is parsed.
MAX_SNAPSHOT_BYTES = 8 * 1024 * 1024
# A snapshot nests four deep ({"leases": [{"gpus": [...]}]}); Python's json parser raises RecursionError
# somewhere near a thousand.
MAX_SNAPSHOT_DEPTH = 32
# How far ahead of this node's clock a snapshot may say it was issued: clocks differ by a little (the
# self-check warns above 2 s), a snapshot from the future by more means one of the two clocks is wrong.
MAX_CLOCK_AHEAD = timedelta(minutes=2)

_JSON_ESCAPE = re.compile(r"\\.", re.DOTALL)
_JSON_STRING = re.compile(r'"[^"]*"')  # once the escapes are gone
_NOT_A_BRACKET = re.compile(r"[^\[\]{}]+")
_DEPTH_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}
_DEPTH_CHUNK = 65536  # brackets counted per step, so the other threads get the GIL in between


class SnapshotRefused(ValueError):
    """The snapshot is not applied; the message says why (it is reported to the portal).

    ``version`` is set when the snapshot was authentic (signed with this node's secret and addressed
    to it) and still refused (a malformed lease, too old): the portal did issue that version, so the
    agent counts it as seen and does not pull it again. A forgery never sets it."""

    def __init__(self, message: str, *, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version


@dataclass(frozen=True)
class LaunchOrder:
    """An environment the lease asks the node to run (protocol.LaunchRequest), checked: ``problem`` says why the
    agent refuses it (that launch alone is refused and reported; the lease is enforced as ever)."""

    number: int
    kind: str = ""
    image: str = ""
    argv: tuple[str, ...] = ()
    memory_max_bytes: int | None = None
    max_processes: int | None = None
    problem: str | None = None

    @property
    def serves_port(self) -> bool:
        return any(PORT_PLACEHOLDER in arg for arg in self.argv)

    @property
    def asks_token(self) -> bool:
        return any(TOKEN_PLACEHOLDER in arg for arg in self.argv)

    @property
    def serves_socket(self) -> bool:
        return any(SOCKET_PLACEHOLDER in arg for arg in self.argv)


@dataclass(frozen=True)
class Lease:
    reservation: int
    user: str
    gpus: tuple[str, ...]
    start: datetime
    end: datetime
    launches: tuple[LaunchOrder, ...] = ()

    def active_at(self, moment: datetime) -> bool:
        return self.start <= moment < self.end


@dataclass(frozen=True)
class Snapshot:
    node: str
    version: int
    issued_at: datetime
    leases: tuple[Lease, ...]
    raw: dict[str, Any]
    # The idle power cap the portal asks for (power.py): a percent of each card's default limit; None: off.
    idle_power_limit_pct: int | None = None


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
    try:
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
            idle_power_limit_pct=_idle_power_limit_pct(raw.get("idle_power_limit_pct")),
        )
    except SnapshotRefused as refusal:
        refusal.version = version  # authentic, and refused all the same
        raise


def decode_snapshot(payload: Any) -> Any:
    """The object in what arrived, for ``parse_snapshot``: JSON text (str or bytes) is checked for size
    and nesting first, then parsed. An object is taken as it is, after the same nesting check: older
    portals pushed the snapshot as an object inside the message, which kombu had already parsed (kept for
    one release, so agents can be upgraded before the portal; the size limit cannot apply to that form)."""
    if isinstance(payload, bytes):
        if len(payload) > MAX_SNAPSHOT_BYTES:
            raise SnapshotRefused(f"larger than {MAX_SNAPSHOT_BYTES} bytes: not read")
        try:
            payload = payload.decode("utf-8")
        except UnicodeDecodeError:
            raise SnapshotRefused("not UTF-8 text") from None
    if isinstance(payload, str):
        if len(payload) > MAX_SNAPSHOT_BYTES:
            raise SnapshotRefused(f"larger than {MAX_SNAPSHOT_BYTES} bytes: not read")
        if json_depth(payload) > MAX_SNAPSHOT_DEPTH:
            raise SnapshotRefused(f"nested deeper than {MAX_SNAPSHOT_DEPTH} levels: not read")
        try:
            return json.loads(payload)
        except (ValueError, RecursionError) as error:  # RecursionError: only if json_depth missed something
            raise SnapshotRefused(f"not JSON: {str(error)[:100]}") from None
    if _nested_deeper_than(payload, MAX_SNAPSHOT_DEPTH):
        raise SnapshotRefused(f"nested deeper than {MAX_SNAPSHOT_DEPTH} levels: not read")
    return payload


def json_depth(text: str) -> int:
    """How deep the arrays and objects of the JSON ``text`` nest (at most; MAX_SNAPSHOT_DEPTH when there
    are no more brackets than that), counted without parsing and so without recursion: escapes and
    strings are removed, then each bracket left counts one level up or down. For text that is not JSON
    the figure means little, and the parser refuses that text anyway. A hostile 8 MB text costs well
    under a second, on the Celery thread; the enforcer's timer is not held up for long at a time."""
    if text.count("[") + text.count("{") <= MAX_SNAPSHOT_DEPTH:
        return MAX_SNAPSHOT_DEPTH  # at most that, whatever the order: most snapshots stop here
    if "\\" in text:
        text = _JSON_ESCAPE.sub("", text)
    brackets = _NOT_A_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = deepest = 0
    for start in range(0, len(brackets), _DEPTH_CHUNK):
        steps = list(accumulate(map(_DEPTH_STEP.__getitem__, brackets[start : start + _DEPTH_CHUNK]), initial=depth))
        deepest, depth = max(deepest, max(steps)), steps[-1]
    return deepest


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether lists and dicts in ``value`` nest deeper than ``limit`` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children = list(item.values())
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def check_fresh(snapshot: Snapshot, *, now: datetime, max_age_seconds: float) -> None:
    """Refuse a received snapshot issued more than ``max_age_seconds`` before ``now``, or more than
    MAX_CLOCK_AHEAD after it. The portal issues a fresh one for every push and pull (and beat re-pushes
    each minute), so an old one is a replay or was held back: applying it could bring back a booking
    cancelled since. The stored snapshot read at start is not checked: it is the last word the node has."""
    age = now - snapshot.issued_at
    issued = snapshot.issued_at.isoformat()
    if age > timedelta(seconds=max_age_seconds):
        raise SnapshotRefused(
            f"version {snapshot.version} was issued at {issued}, more than MAX_SNAPSHOT_AGE_SECONDS "
            f"({max_age_seconds:.0f} s) ago: a delayed or replayed snapshot",
            version=snapshot.version,
        )
    if -age > MAX_CLOCK_AHEAD:
        raise SnapshotRefused(
            f"version {snapshot.version} was issued at {issued}, more than {MAX_CLOCK_AHEAD.seconds} s ahead "
            "of this node's clock: check NTP here and on the portal",
            version=snapshot.version,
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
    launches = item.get("launches", [])
    if not isinstance(launches, list):
        raise SnapshotRefused(f"{where}: launches must be a list")
    return Lease(
        reservation=reservation,
        user=user,
        gpus=tuple(gpus),
        start=start,
        end=end,
        launches=tuple(_launch_order(request, position) for position, request in enumerate(launches)),
    )


def _launch_order(request: Any, position: int) -> LaunchOrder:
    number = request.get("number") if isinstance(request, dict) else None
    if not isinstance(number, int) or isinstance(number, bool) or number < 1:
        number = 0  # reported as the position's launch: there is no better name for it
    problem = launch_problem(request)
    if problem is None and position >= MAX_LAUNCHES:
        problem = f"a lease runs at most {MAX_LAUNCHES} environments"
    if problem is not None:
        return LaunchOrder(number=number, problem=problem)
    return LaunchOrder(
        number=number,
        kind=request["kind"],
        image=request["image"],
        argv=tuple(request["argv"]),
        memory_max_bytes=request.get("memory_max_bytes"),
        max_processes=request.get("max_processes"),
    )


def _idle_power_limit_pct(value: Any) -> int | None:
    """The idle power cap: absent or null (off), or a whole percent the protocol allows."""
    if value is None:
        return None
    if (
        not isinstance(value, int)
        or isinstance(value, bool)
        or not IDLE_POWER_LIMIT_PCT_MIN <= value <= IDLE_POWER_LIMIT_PCT_MAX
    ):
        raise SnapshotRefused(
            f"idle_power_limit_pct {value!r}: must be a whole percent from {IDLE_POWER_LIMIT_PCT_MIN} to "
            f"{IDLE_POWER_LIMIT_PCT_MAX}, or null"
        )
    return value


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
