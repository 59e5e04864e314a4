"""Converging the node to its newest lease snapshot, on the agent's own clock.

Level-triggered and fail-closed (docs/architecture.md): at any moment the GPUs' ACLs must be
exactly what the stored snapshot's leases say for *now*. Leases name units, whole cards or MIG
slices; ACLs are kept per file (access.py): a slice's grant is its card's device file, which its
card's other slices share, and its own capability files. Two things drive that:

- a timer set for the next boundary (a lease start or end, a cleanup deadline), so a slot
  opens and closes within milliseconds of its time, from the in-memory view of the ACLs;
- a full reconcile every few seconds, which reads the MIG layout and the real ACLs back, repairs
  any drift and looks for processes that have no business on a GPU.

Nothing here waits on the portal or the broker: once a snapshot is stored, every end in it
is enforced even if both are gone. The agent never extends a lease by itself.

Every pass also applies the snapshot's idle power cap (power.py): a card a lease starts on gets its limit back
before it is granted, a card no lease holds is capped after the grants and revocations.

Looking for processes (a /proc scan) and ending them (SIGTERM, wait, SIGKILL: seconds) run on
a second thread, the checker, so the boundary timer is never held up by either.
"""

from __future__ import annotations

import logging
import math
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpubook_agent import acl, cleanup, procfs, protocol
from gpubook_agent.access import AccessMap
from gpubook_agent.accounts import CACHE_SECONDS, AccountCheck
from gpubook_agent.config import AgentConfig
from gpubook_agent.gpus import GpuBackend
from gpubook_agent.power import PowerCap
from gpubook_agent.snapshot import Lease, Snapshot, SnapshotRefused, check_fresh, decode_snapshot, parse_snapshot
from gpubook_agent.store import SnapshotStore, StateFileIgnored

log = logging.getLogger(__name__)

Report = Callable[..., None]  # report(kind, **fields): one event for the portal
RECENT_REVOCATION = timedelta(hours=24)  # how long a revoked holder's processes count as leftovers
# Why a holder keeps a GPU it should have lost (the ``unkillable`` event's message).
STUCK_AFTER_SIGNALS = "did not exit after SIGTERM and SIGKILL (uninterruptible sleep in the driver, typically)"
RUNS_AS_ROOT = (
    "runs with root's privileges (a set-user-ID program such as su holding the device open): the agent never "
    "signals root, so an admin must end it"
)
REFUSAL_REPORT_INTERVAL = 60.0  # seconds between two reports of the same refusal
REVOKE_ALL_ATTEMPTS = 3  # a stop reads the files back and tries again while an entry is left
PASS_WAIT_SECONDS = 30.0  # how long a stop waits for a pass in progress (each setfacl gives up after 10 s)
# The grant ledger is rewritten in short once it has more lines than this many per entry, and this many more.
LEDGER_LINES_PER_ENTRY, LEDGER_SLACK_LINES = 4, 256


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Job:
    """Work for the checker thread: look at who uses each GPU ("check"), end what an expired holder left on a
    GPU or MIG slice ("expired"), or rewrite the grant ledger, which grew long, in short ("ledger")."""

    kind: str
    gpu: str = ""
    user: str = ""


class Enforcer:
    """Owns the GPUs' ACLs. ``offer`` takes snapshots (any thread); ``run`` enforces them."""

    MIN_WAIT = 0.0005  # seconds; a timer that fires a hair early just goes round once more

    def __init__(
        self,
        *,
        config: AgentConfig,
        backend: GpuBackend,
        store: SnapshotStore,
        report: Report,
        clock: Callable[[], datetime] = utcnow,
        accounts: AccountCheck | None = None,
    ) -> None:
        self.config = config
        self.backend = backend
        self.store = store
        self.report = report
        self.clock = clock
        self.paths = {gpu.uuid: backend.device_path(gpu.uuid) for gpu in backend.gpus()}  # card -> device file
        self.access = AccessMap.build(self.paths, ())
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._snapshot: Snapshot | None = None
        self._seen_version = 0  # the newest authentic version received, applied or refused
        # Per unit (card or slice), the users every file of its grant carries; per file, the users with an entry.
        self._held: dict[str, set[str]] = {uuid: set() for uuid in self.paths}
        self._files: dict[str, set[str]] = {}
        self._slice_cards: dict[str, str] = {}  # every slice seen since start -> its card, to name it once gone
        self._unit_refusals: set[tuple[int, str, str]] = set()  # (reservation, unit, why) reported already
        self._cleanups: dict[tuple[str, str], datetime] = {}  # (gpu, user) -> when to end what is left
        self._cleaning: set[tuple[str, str]] = set()  # handed to the checker, not finished yet
        # Every revocation of the last day, kept on disk: whatever its holder still runs on that GPU
        # after the grace period is a leftover to end (not a mere violation), even after a restart
        # and even if it turns up later (a forked child, a descriptor passed on).
        self._revoked_at: dict[tuple[str, str], datetime] = {}
        self._revocations_dirty = False
        # The ACL entries this agent made and has not taken back, (file, user), on disk too: written before a grant
        # is made, so that after a SIGKILL ``gpubook-agent revoke-all`` can take back exactly these (and nothing
        # an admin set by hand). Read at start (restore).
        self._ledger: set[tuple[str, str]] = set()
        self._ledger_failure = ""  # the last failure to write it, reported once
        self._ledger_lock = threading.Lock()
        # Held while a pass changes files (the enforcer thread; the start's, in the main thread): revoke_all waits
        # for it. Reentrant: revoke_all's own passes take it too.
        self._passing = threading.RLock()
        self._refusals_reported: dict[str, float] = {}
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._check_pending = threading.Event()
        self._violations_seen: set[tuple[str, int]] = set()
        self._unkillable: set[tuple[str, int]] = set()  # (unit, pid) reported as unkillable, while it lives
        self._failures_seen: set[tuple[str, str, int]] = set()
        self._unknown_gpus_seen: set[str] = set()
        self._nvml_pids: dict[str, set[int]] = {}
        self.drained: set[str] = set()
        self._uid_min = procfs.uid_min()
        # The node's own word on who may have a GPU: an account it has, with an ordinary uid.
        self.accounts = accounts or AccountCheck(uid_min=self._uid_min, protected=config.protected_users)
        self._refused_leases: set[tuple[int, str]] = set()  # reported already
        self._threads: list[threading.Thread] = []
        # Changes to different files run side by side; each touches only its own files' state.
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="agent-acl")
        self.power = PowerCap(backend=backend, cards=self.paths, report=report, allowed=config.allow_power_cap)
        self.after_pass: Callable[[], None] = lambda: None  # main.py: the launches look at once (launches.py)
        self.refresh_layout()

    def refresh_layout(self) -> None:
        """Read the MIG layout again (cards' modes, their slices): slices are made and destroyed, and modes
        changed, while the agent runs. Units and files that leave keep their state until it is taken back."""
        try:
            cards = self.backend.mig_cards()
        except Exception:  # a backend failure keeps the last layout: the rest of enforcement goes on
            log.exception("reading the MIG layout failed; keeping the last one")
            return
        access = AccessMap.build(self.paths, cards)
        for uuid, item in access.slices.items():
            self._slice_cards[uuid] = item.card
            self._held.setdefault(uuid, set())
        for path in access.managed:
            self._files.setdefault(path, set())
        for path in [path for path in self._files if path not in access.managed and not os.path.exists(path)]:
            del self._files[path]  # a capability file removed from disk carries nobody
        self.access = access

    def mig_layout(self) -> list[protocol.MigCard]:
        """The MIG cards as last read, for the heartbeat."""
        return [card.as_dict() for card in self.access.cards.values()]

    # -- snapshots --------------------------------------------------------------------------

    @property
    def applied_version(self) -> int:
        snapshot = self._snapshot
        return snapshot.version if snapshot else 0

    @property
    def seen_version(self) -> int:
        """The newest version the portal is known to have issued to this node: applied, or authentic
        (signed with this node's secret, addressed to it) and refused. The pull compares the portal's
        version with this one. A forgery never counts: anyone who can write to the queue could
        otherwise claim any version, and the node would never pull again."""
        return max(self.applied_version, self._seen_version)

    def offer(self, raw: Any) -> str:
        """Accept ``raw`` if it is valid, fresh and newer than what is applied: 'applied', 'stale' or
        'refused'. ``raw`` is a snapshot's JSON text (a push's one argument, a pull's body), or the object
        older portals pushed. Nothing in it can make this raise, and what is refused changes nothing."""
        try:
            return self._offer(raw)
        except Exception as error:  # a bug, or an input nobody thought of: still a refusal, never a crash
            log.exception("offering a snapshot failed")
            self._report_refusal(f"snapshot not applied: {type(error).__name__} while checking it")
            return "refused"

    def refuse(self, message: str) -> None:
        """Report what came for the enforcer and never reached ``offer`` (a message the worker could not
        decode, or one for another task): a refused snapshot like any other."""
        log.warning("snapshot refused: %s", message)
        self._report_refusal(message)

    def _offer(self, raw: Any) -> str:
        try:
            snapshot = parse_snapshot(
                decode_snapshot(raw), node_name=self.config.node_name, secret=self.config.lease_secret
            )
        except SnapshotRefused as refusal:
            with self._lock:  # pushes (the Celery thread) and pulls (the reporter's) both offer
                self._note_seen(refusal.version)
            self.refuse(str(refusal))
            return "refused"
        with self._lock:
            self._note_seen(snapshot.version)
            current = self.applied_version
            if snapshot.version <= current:
                if snapshot.version < current:
                    # Also what a push delayed past a pull looks like: one report a minute says enough.
                    self._report_refusal(
                        f"version {snapshot.version} is older than the applied version {current}", reason="older"
                    )
                return "stale"
            try:
                check_fresh(snapshot, now=self.clock(), max_age_seconds=self.config.max_snapshot_age_seconds)
            except SnapshotRefused as refusal:
                self.refuse(str(refusal))
                return "refused"
            try:
                self.store.save(snapshot.raw)
            except OSError as error:
                # Enforce it anyway (it may end a slot early); a restart falls back to the stored one.
                log.error("cannot store snapshot %d: %s", snapshot.version, error)
                self.report("store_failed", version=snapshot.version, message=f"{self.store.path}: {error}")
            self._snapshot = snapshot
            self._failures_seen.clear()
            self._unknown_gpus_seen.clear()
        # Applied: what follows only reports, and a failure there must not read as a refusal.
        try:
            self.report("snapshot_applied", version=snapshot.version, leases=len(snapshot.leases))
            # Look every account up now, off the boundary path: a refusal is reported before its slot
            # starts, and the boundary finds the answer cached.
            for lease in snapshot.leases:
                self._lease_refused(lease)
        except Exception:
            log.exception("after applying snapshot %d", snapshot.version)
        finally:
            self._wake.set()
        return "applied"

    def _note_seen(self, version: int | None) -> None:
        if version is not None and version > self._seen_version:
            self._seen_version = version

    def _report_refusal(self, message: str, *, reason: str | None = None) -> None:
        """Report a refused snapshot, at most once a minute per reason (``reason``, or the message itself):
        anyone holding the broker URL can send junk, and it must not flood the event buffer or the portal."""
        key = reason or message
        last = self._refusals_reported.get(key)
        if last is not None and time.monotonic() - last < REFUSAL_REPORT_INTERVAL:
            return
        if len(self._refusals_reported) > 1000:
            self._refusals_reported.clear()
        self._refusals_reported[key] = time.monotonic()
        self.report("snapshot_refused", message=message)

    def restore(self) -> None:
        """Load the stored snapshot (verified again), so enforcement resumes before any message,
        and the recent revocations, so their leftovers are still ended."""
        self._revoked_at = self._load_revocations()
        self._ledger = self._load_ledger()
        try:
            raw = self.store.load()
        except StateFileIgnored as problem:  # a link, not the agent's own file, not JSON: not read
            log.error("stored snapshot not used (%s); starting with no leases", problem)
            self.report("snapshot_refused", message=f"stored snapshot: {problem}")
            return
        if raw is None:
            return
        try:
            self._snapshot = parse_snapshot(
                decode_snapshot(raw), node_name=self.config.node_name, secret=self.config.lease_secret
            )
        except SnapshotRefused as refusal:
            # A rotated secret or an edited file: trust nothing, so every grant is removed. Not checked
            # for freshness (check_fresh): after a long outage it is still the last word the node has.
            log.error("stored snapshot not trusted (%s); starting with no leases", refusal)
            self.report("snapshot_refused", message=f"stored snapshot: {refusal}")
            return
        for lease in self._snapshot.leases:
            self._lease_refused(lease)

    def _load_revocations(self) -> dict[tuple[str, str], datetime]:
        """The signed revocation log, less what is older than a day. A log that fails its signature, is
        malformed or is not a plain file of the agent's own is ignored and reported (once: this runs at
        start). Ignoring it is the safe side: an edited log could otherwise name anyone's processes for
        ending; without it, what a holder of the last day left running is reported as a violation (and
        ended only with END_VIOLATIONS) instead of being ended as a leftover."""
        try:
            revocations = self.store.load_revocations(secret=self.config.lease_secret)
        except StateFileIgnored as problem:
            log.error("revocation log ignored: %s", problem)
            self.report("store_failed", message=f"revocation log ignored: {problem}")
            self._revocations_dirty = True  # the checker replaces it with the agent's own, signed
            return {}
        now = self.clock()
        return {key: at for key, at in revocations.items() if now - at <= RECENT_REVOCATION}

    def _load_ledger(self) -> set[tuple[str, str]]:
        """The grant ledger of the last run. One that fails a signature or is malformed is ignored and reported
        (the start removes every grant no stored lease backs anyway), and the agent starts a new one."""
        try:
            return self.store.load_grants(secret=self.config.lease_secret)
        except StateFileIgnored as problem:
            log.error("grant ledger ignored: %s", problem)
            self.report("store_failed", message=f"grant ledger ignored: {problem}")
            self._ledger_write(lambda: self.store.rewrite_grants(set(), secret=self.config.lease_secret))
            return set()

    def _ledger_add(self, entries: set[tuple[str, str]]) -> None:
        """Write the entries about to be granted into the ledger first, so it is never behind the ACLs."""
        new = entries - self._ledger
        if new:
            ledger = self._ledger = self._ledger | new
            secret = self.config.lease_secret
            self._ledger_write(lambda: self.store.append_grants("+", new, current=ledger, secret=secret))

    def _ledger_settle(self, wanted_files: dict[str, set[str]]) -> None:
        """After a pass: the ledger keeps the entries that are on the files now and that the agent made or wants
        there; what was taken back (or never made, a grant that failed) leaves it. Now and then the checker
        rewrites it whole, so that it stays short."""
        present = self._entries_on_files()
        wanted = {(path, user) for path, users in wanted_files.items() for user in users}
        ledger = (self._ledger | (present & wanted)) & (present | self._unread_ledger())
        gone, adopted = self._ledger - ledger, ledger - self._ledger
        if not (gone or adopted):
            return
        self._ledger = ledger
        secret = self.config.lease_secret
        self._ledger_write(lambda: self.store.append_grants("-", gone, current=ledger, secret=secret))
        self._ledger_write(lambda: self.store.append_grants("+", adopted, current=ledger, secret=secret))
        if self.store.grant_lines > LEDGER_LINES_PER_ENTRY * len(ledger) + LEDGER_SLACK_LINES:
            self._jobs.put(Job("ledger"))

    def _compact_ledger(self) -> None:
        # The ledger as it is once the lock is held: an append waiting for the lock then follows the rewrite.
        self._ledger_write(lambda: self.store.rewrite_grants(self._ledger, secret=self.config.lease_secret))

    def _entries_on_files(self) -> set[tuple[str, str]]:
        """Every (file, user) entry on the files the agent keeps, as it last read or set them."""
        return {(path, user) for path, users in self._files.items() for user in users}

    def _unread_ledger(self) -> set[tuple[str, str]]:
        """Ledger entries on files the agent does not keep now (a capability file gone from the layout): kept until
        the file is gone, so ``revoke-all`` still finds them."""
        return {(path, user) for path, user in self._ledger if path not in self._files and os.path.exists(path)}

    def _ledger_write(self, write: Callable[[], None]) -> None:
        """One change to the ledger file, under a lock (the enforcer appends, the checker rewrites). A failure is
        reported once: the grants are made all the same, as the ACLs matter more than the ledger."""
        try:
            with self._ledger_lock:
                write()
        except OSError as error:
            message = f"cannot write the grant ledger {self.store.grants_path}: {error}"
            if message != self._ledger_failure:
                self._ledger_failure = message
                log.error("%s", message)
                self.report("store_failed", message=message)
        else:
            self._ledger_failure = ""

    # -- what should be ---------------------------------------------------------------------

    def desired(self, now: datetime) -> dict[str, set[str]]:
        """For each unit of this node (card, MIG slice), the users whose lease covers ``now``. A lease that
        names a card in MIG mode covers each of its slices too."""
        access = self.access
        wanted: dict[str, set[str]] = {uuid: set() for uuid in access.units()}
        drained = set(self.drained)  # the checker thread changes it
        snapshot = self._snapshot
        for lease in snapshot.leases if snapshot else ():
            if not lease.active_at(now):
                continue
            if self._lease_refused(lease, max_age=math.inf):
                # Refusing blocks a grant, never takes one back: NSS answers "no such user" when
                # its directory is unreachable, and that must not end a running slot's jobs.
                for uuid in lease.gpus:
                    for unit in access.lease_units(uuid):
                        if lease.user in self._held.get(unit, ()):
                            wanted[unit].add(lease.user)
                continue
            for uuid in lease.gpus:
                units = access.lease_units(uuid)
                for unit in units:
                    if unit in drained and lease.user not in self._held.get(unit, ()):
                        # A process the agent could not end still holds it: nobody new shares a GPU with that.
                        self._refuse_unit(
                            lease,
                            unit,
                            "drained",
                            f"GPU {unit} is drained: a process the agent could not end still holds it; the slot "
                            "opens once it is gone",
                        )
                        continue
                    wanted[unit].add(lease.user)
                if units:
                    self._check_slice(access, lease, uuid)
                elif uuid in self._slice_cards:
                    card = self._slice_cards[uuid]
                    self._refuse_unit(
                        lease,
                        uuid,
                        "gone",
                        f"MIG slice {uuid} of card {card} is not on the card now (MIG mode is off there, or the "
                        "slice was destroyed): nothing is opened for it, and the card's device file is not touched",
                    )
                elif uuid not in self._unknown_gpus_seen:
                    self._unknown_gpus_seen.add(uuid)
                    self.report("unknown_gpu", gpu=uuid, user=lease.user, reservation=lease.reservation)
        return wanted

    def active_leases(self, now: datetime) -> list[tuple[Lease, tuple[str, ...] | None]]:
        """The leases active at ``now`` whose account this node takes, each with the device files its user holds
        for it (every file of every unit it names, as the enforcer last set them), or None while some of those
        are not open to the user yet. For the launches (launches.py): they start once their GPUs are open."""
        snapshot = self._snapshot
        access = self.access
        found: list[tuple[Lease, tuple[str, ...] | None]] = []
        for lease in snapshot.leases if snapshot else ():
            if not lease.active_at(now) or self.accounts.refusal(lease.user, max_age=math.inf) is not None:
                continue
            units = [unit for uuid in lease.gpus for unit in access.lease_units(uuid)]
            files = tuple(dict.fromkeys(path for unit in units for path in access.grant_files.get(unit, ())))
            held = units and all(lease.user in self._held.get(unit, ()) for unit in units)
            found.append((lease, files if held and files else None))
        return found

    def refused_leases(self, now: datetime) -> list[tuple[Lease, str]]:
        """The leases active at ``now`` whose account this node refuses, each with the reason (cached answers)."""
        snapshot = self._snapshot
        refused = []
        for lease in snapshot.leases if snapshot else ():
            if lease.active_at(now) and (reason := self.accounts.refusal(lease.user, max_age=math.inf)) is not None:
                refused.append((lease, reason))
        return refused

    def upcoming_leases(self, now: datetime, within: timedelta) -> list[Lease]:
        """The stored snapshot's leases starting after ``now`` and within ``within`` of it."""
        snapshot = self._snapshot
        return [lease for lease in snapshot.leases if now < lease.start <= now + within] if snapshot else []

    def lease_of(self, reservation: int) -> Lease | None:
        """The stored snapshot's lease of ``reservation``, if it has one."""
        snapshot = self._snapshot
        return (
            next((lease for lease in snapshot.leases if lease.reservation == reservation), None) if snapshot else None
        )

    def _check_slice(self, access: AccessMap, lease: Lease, uuid: str) -> None:
        """Report (once) what keeps a slice lease from opening its slice in full."""
        item = access.slices.get(uuid)
        if item is None:
            return
        card = access.cards[item.card]
        if not access.grant_files.get(uuid):
            self._refuse_unit(
                lease,
                uuid,
                "no capability files",
                f"MIG slice {uuid} of card {card.uuid}: the mig-minors file does not name its capability files "
                f"(GPU instance {item.gpu_instance_id}, compute instance {item.compute_instance_id}): nothing is "
                "opened for it",
            )
        elif not card.slices_open:
            now_on, then_on = ("on" if card.mode_current else "off"), ("on" if card.mode_pending else "off")
            self._refuse_unit(
                lease,
                uuid,
                "MIG mode change pending",
                f"MIG slice {uuid} of card {card.uuid}: a MIG mode change is pending on the card (MIG {now_on} now, "
                f"{then_on} after the next reset), so its device file is not opened for the slice: at the reset it "
                "would be the whole card. The slice's capability files alone open nothing",
            )

    def _refuse_unit(self, lease: Lease, uuid: str, why: str, message: str) -> None:
        """Report (once per reservation, unit and reason) that a lease's unit is not opened, and why."""
        key = (lease.reservation, uuid, why)
        if key in self._unit_refusals:
            return
        if len(self._unit_refusals) > 10_000:
            self._unit_refusals.clear()
        self._unit_refusals.add(key)
        log.warning("lease of reservation %d: %s", lease.reservation, message)
        self.report("lease_refused", gpu=uuid, user=lease.user, reservation=lease.reservation, message=message)

    def _lease_refused(self, lease: Lease, *, max_age: float = CACHE_SECONDS) -> bool:
        """Whether this node refuses the lease's account (no such account, a system account, a
        protected one): that lease alone is not enforced, and the refusal is reported once. The
        boundary path passes ``max_age=inf`` (cached answers only, looked up if never seen)."""
        reason = self.accounts.refusal(lease.user, max_age=max_age)
        if reason is None:
            return False
        key = (lease.reservation, lease.user)
        if key not in self._refused_leases:
            if len(self._refused_leases) > 10_000:
                self._refused_leases.clear()
            self._refused_leases.add(key)
            log.warning("lease of reservation %d refused: %s", lease.reservation, reason)
            self.report("lease_refused", user=lease.user, reservation=lease.reservation, message=reason)
        return True

    def next_boundary(self, now: datetime) -> datetime | None:
        """The first lease start or end, or cleanup deadline, after ``now``."""
        moments = [deadline for deadline in self._cleanups.values()]
        snapshot = self._snapshot
        for lease in snapshot.leases if snapshot else ():
            moments.extend(moment for moment in (lease.start, lease.end) if moment > now)
        return min(moments, default=None)

    # -- making it so -----------------------------------------------------------------------

    def converge(self, now: datetime) -> None:
        """Apply the difference between the wanted ACLs and the ones in force, with the idle power cap around it:
        limits given back before the grants, idle cards capped after them."""
        wanted = self.desired(now)
        busy = {self.access.card_of(unit) for unit, users in wanted.items() if users}
        self._power(self.power.give_back, busy)
        self._enforce(wanted, now)
        self._power(self.power.cap_idle, busy)

    def _power(self, step: Callable[[int | None, set[str]], None], busy: set[str]) -> None:
        """The idle power cap (power.py): ``give_back`` the limit of the cards anyone holds now before the grants,
        so a booking starts at full power; ``cap_idle`` the others after them. A failure never holds up a grant."""
        snapshot = self._snapshot
        try:
            step(snapshot.idle_power_limit_pct if snapshot else None, busy)
        except Exception:
            log.exception("the idle power cap failed; enforcing the leases goes on")

    def restore_power(self) -> None:
        """On a clean stop: every card the agent capped gets its limit back (nothing would restore it for a
        booking while the agent is stopped)."""
        try:
            self.power.restore_all("the agent stops")
        except Exception:
            log.exception("giving the cards their power limits back failed")

    def _enforce(self, wanted: dict[str, set[str]], now: datetime) -> None:
        """Bring every file to the users ``wanted`` (unit -> users) puts on it, then report per unit.

        Boundaries often fall together (a hand-over is an end and a start; many slots start on
        the hour), and each setfacl is a process: so files that change alike (a slice's three files
        at its start) go in one call, a file's revokes and grants in the same one, and calls run
        side by side.
        """
        with self._passing:
            self._enforce_now(wanted, now)

    def _enforce_now(self, wanted: dict[str, set[str]], now: datetime) -> None:
        access = self.access
        wanted_files = access.files_wanted(wanted)
        # Entries no unit the user holds explains (left from before a restart, added by hand): reported
        # as revoked from the file's own unit when they go.
        strays = {
            (path, user)
            for path, users in self._files.items()
            for user in users - wanted_files.get(path, set())
            if not any(user in self._held.get(unit, ()) for unit in access.units_of_file.get(path, ()))
        }
        changes: dict[tuple[tuple[str, ...], tuple[str, ...]], list[str]] = {}
        for path, users in wanted_files.items():
            current = self._files.setdefault(path, set())
            revokes, grants = tuple(sorted(current - users)), tuple(sorted(users - current))
            if revokes or grants:
                changes.setdefault((revokes, grants), []).append(path)
        for path in set(self._files) - set(wanted_files):  # a file no longer in the layout: nobody on it
            if self._files[path]:
                changes.setdefault((tuple(sorted(self._files[path])), ()), []).append(path)
        planned = [(paths, list(revokes), list(grants)) for (revokes, grants), paths in changes.items()]
        if self._stop.is_set():  # stopping: take back, never give
            planned = [(paths, revokes, []) for paths, revokes, _ in planned if revokes]
        self._ledger_add({(path, user) for paths, _, grants in planned for path in paths for user in grants})
        if len(planned) == 1 or self._stop.is_set():  # stopping: the pool is shut (revoke_all)
            for plan in planned:
                self._change(*plan)
        elif planned:

            def change(plan: tuple[list[str], list[str], list[str]]) -> None:
                self._change(*plan)

            list(self._pool.map(change, planned))
        self._settle(wanted, wanted_files, strays, now)
        self._ledger_settle(wanted_files)

    def _settle(
        self,
        wanted: dict[str, set[str]],
        wanted_files: dict[str, set[str]],
        strays: set[tuple[str, str]],
        now: datetime,
    ) -> None:
        """Per unit, what the file changes made of it: a user held once every file of its grant carries them,
        and no longer once none it should lose still does (revocations first, as on one file)."""
        access = self.access
        granted: list[tuple[str, str]] = []
        for unit in sorted(set(self._held) | set(wanted)):
            held = self._held.setdefault(unit, set())
            users = wanted.get(unit, set())
            files = access.reach.get(unit, ())
            for user in sorted(held - users):
                if all(user not in self._files.get(path, ()) or user in wanted_files.get(path, ()) for path in files):
                    held.discard(user)
                    self._revoked(unit, user, now)
            for user in sorted(users - held):
                grant = access.grant_files.get(unit, ())
                if grant and all(user in self._files.get(path, ()) for path in grant):
                    granted.append((unit, user))
        reported: set[tuple[str, str]] = set()
        for path, user in sorted(strays):
            owner = access.owner(path)
            if owner is not None and user not in self._files.get(path, ()) and (owner, user) not in reported:
                reported.add((owner, user))
                self._revoked(owner, user, now)
        for unit, user in granted:
            self._held[unit].add(user)
            self._granted_to(unit, user, now)

    def _change(self, paths: list[str], revokes: list[str], grants: list[str]) -> None:
        """One setfacl for files that change alike; if that fails, file by file, and then one user at a
        time, revokes first, so a name the node does not know never holds up a revocation. Once the agent stops, a
        change still on its way gives nothing (a pool thread may start one after the stop began)."""
        if self._stop.is_set():
            grants = []
            if not revokes:
                return
        try:
            acl.change_many(paths, revoke=revokes, grant=grants)
        except acl.AclError:
            for path in paths:
                self._change_one(path, revokes, grants)
            return
        for path in paths:
            self._files[path] = (self._files.get(path, set()) - set(revokes)) | set(grants)

    def _change_one(self, path: str, revokes: list[str], grants: list[str]) -> None:
        if len(revokes) + len(grants) > 1:
            try:
                acl.change(path, revoke=revokes, grant=grants)
            except acl.AclError:
                pass
            else:
                self._files[path] = (self._files.get(path, set()) - set(revokes)) | set(grants)
                return
        unit = self.access.owner(path) or path
        for user in revokes:
            try:
                acl.revoke(path, user)
            except acl.AclError as error:
                self._report_once("revoke_failed", unit, user, str(error))
            else:
                self._files.setdefault(path, set()).discard(user)
        for user in grants:
            try:
                acl.grant(path, user)
            except acl.AclError as error:
                self._report_once("grant_failed", unit, user, str(error))
            else:
                self._files.setdefault(path, set()).add(user)

    def revoke_all(self) -> list[tuple[str, str]]:
        """On a stop: take every grant back, from every file the agent keeps (its MIG capability files too) and
        every entry its ledger names. With no agent running nothing would end a slot, so a stopped agent leaves
        the GPUs closed (fail closed); a restart restores what the stored snapshot allows within a second.

        Called after ``stop``. Nothing grants from then on, but a change already handed to a setfacl can land: so it
        first waits for the pool's changes and for a pass still running (a pass the start made in the main thread,
        cut short by a stop signal, leaves its pool threads at work), then reads the files. Read back and tried
        again while entries remain; returns those that could not be removed (each reported as ``revoke_failed``)."""
        self._stop.set()
        self._pool.shutdown(wait=True)
        if not self._passing.acquire(timeout=PASS_WAIT_SECONDS):
            log.error("a pass did not finish within %ss; taking the grants back beside it", PASS_WAIT_SECONDS)
        else:
            self._passing.release()
        remaining: list[tuple[str, str]] = []
        for _attempt in range(REVOKE_ALL_ATTEMPTS):
            now = self.clock()
            self._read_files()
            nobody: dict[str, set[str]] = {uuid: set() for uuid in self.access.units()}
            self._adopt(nobody)
            self._enforce(nobody, now)
            for path, user in sorted(self._unread_ledger()):
                try:
                    acl.revoke(path, user)
                except acl.AclError as error:
                    self._report_once("revoke_failed", self.access.owner(path) or path, user, str(error))
            self._read_files()
            self._ledger_settle({})
            remaining = sorted(self._entries_on_files() | self._unread_ledger())
            if not remaining:
                break
        self._persist_revocations(self.clock())
        return remaining

    def reconcile(self, now: datetime) -> None:
        """Read the layout, the real ACLs and the power limits back and converge; then have the checker look at who
        uses each GPU."""
        self.refresh_layout()
        self.power.reread()
        self._read_files()
        self._adopt(self.desired(now))
        self.converge(now)
        if not self._check_pending.is_set():  # one check waiting is enough
            self._check_pending.set()
            self._jobs.put(Job("check"))

    def _read_files(self) -> None:
        """Every kept file's users as the kernel has them; a unit whose grant lost a user's entry no longer
        counts as held by them, so the converge that follows grants it again (and says so)."""
        for path in sorted(self._files):
            try:
                self._files[path] = acl.granted_users(path)
            except acl.AclError as error:
                self._report_once("acl_error", self.access.owner(path) or path, "", str(error))
        for unit, held in self._held.items():
            files = self.access.grant_files.get(unit)
            if files:
                held.intersection_update(*(self._files.get(path, set()) for path in files))

    def _adopt(self, wanted: dict[str, set[str]]) -> None:
        """Count as held the units whose every file carries a user already: wanted ones (a restart finds them
        granted), and unwanted ones, so that taking them back is reported once per unit rather than per file."""
        access = self.access
        wanted_files = access.files_wanted(wanted)
        for unit, files in access.grant_files.items():
            if not files:
                continue
            carried = set.intersection(*(self._files.get(path, set()) for path in files)) - self._held.get(unit, set())
            for user in carried:
                if user in wanted.get(unit, ()) or any(user not in wanted_files.get(path, ()) for path in files):
                    self._held.setdefault(unit, set()).add(user)

    def startup(self) -> None:
        """Restore the stored snapshot and remove every grant it does not back, before anything else."""
        self.restore()
        now = self.clock()
        # Leases of the stored snapshot that ended while the agent was away count as revoked then,
        # in case the agent died before it could write that down.
        snapshot = self._snapshot
        for lease in snapshot.leases if snapshot else ():
            if lease.end <= now:
                for uuid in lease.gpus:
                    for unit in self.access.lease_units(uuid) or (uuid,):
                        self._revoked_at.setdefault((unit, lease.user), lease.end)
        grace = timedelta(seconds=self.config.grace_seconds)
        for key, at in self._revoked_at.items():
            if at + grace > now and key[0] in self._held:
                self._cleanups[key] = at + grace
        try:  # the caps an agent killed before its clean stop left: the stored snapshot's policy tells them
            self.power.adopt(snapshot.idle_power_limit_pct if snapshot else None)
        except Exception:
            log.exception("reading the cards' power limits at start failed")
        self.reconcile(now)

    def _granted_to(self, uuid: str, user: str, now: datetime) -> None:
        self._cleanups.pop((uuid, user), None)
        self.report("granted", gpu=uuid, user=user, **self._lease_fields(uuid, user, now, starting=True))

    def _revoked(self, uuid: str, user: str, now: datetime) -> None:
        if not user.isdigit():  # an entry left for a deleted account has no processes to end
            self._cleanups[(uuid, user)] = now + timedelta(seconds=self.config.grace_seconds)
            self._revoked_at[(uuid, user)] = now
            self._revocations_dirty = True  # written by the checker, off the boundary path
        self.report("revoked", gpu=uuid, user=user, **self._lease_fields(uuid, user, now, starting=False))

    def _lease_fields(self, uuid: str, user: str, now: datetime, *, starting: bool) -> dict[str, Any]:
        """The reservation and boundary behind a change, when a lease explains it (for reports and bench)."""
        snapshot = self._snapshot
        card = self.access.card_of(uuid)
        best = None
        for lease in snapshot.leases if snapshot else ():
            if lease.user == user and (uuid in lease.gpus or card in lease.gpus):
                boundary = lease.start if starting else lease.end
                if boundary <= now and (best is None or boundary > best[1]):
                    best = (lease.reservation, boundary)
        if best is None:
            return {}
        return {"reservation": best[0], "boundary": best[1].isoformat()}

    # -- processes --------------------------------------------------------------------------

    def note_gpu_processes(self, pids_by_gpu: dict[str, set[int]]) -> None:
        """Pids NVML lists per GPU and slice (from the telemetry sampler), joined with the /proc scan."""
        self._nvml_pids = pids_by_gpu

    def _listed_pids(self) -> dict[str, set[int]]:
        """The backend's process lists per unit; a card in MIG mode is left out, as NVML lists every slice's
        processes on it: each slice's own list says whose they are."""
        cards = self.access.cards
        return {
            uuid: pids for uuid, pids in self._nvml_pids.items() if not (uuid in cards and cards[uuid].mode_current)
        }

    def holders(self) -> dict[str, list[cleanup.Holder]]:
        """Processes on each unit: one of its files held open, or listed by the GPU backend."""
        access = self.access
        by_path = procfs.fd_holders(access.managed)
        listed = self._listed_pids()
        found: dict[str, list[cleanup.Holder]] = {}
        for uuid in access.units():
            pids = {pid for path in access.reach.get(uuid, ()) for pid in by_path.get(path, ())}
            pids |= listed.get(uuid, set())
            found[uuid] = [holder for holder in cleanup.describe(sorted(pids)) if not self._protected(holder)]
        return found

    def _protected(self, holder: cleanup.Holder) -> bool:
        return cleanup.protected(
            holder, allow_users=self.config.protected_users, own_pid=os.getpid(), uid_min=self._uid_min
        )

    def check_holders(self, now: datetime) -> None:
        """Report (and, by policy, end) processes on a GPU or slice whose user holds no lease on it. First,
        off the boundary path, look the leases' accounts up again where the answer is a minute old."""
        snapshot = self._snapshot
        for lease in snapshot.leases if snapshot else ():
            if lease.end > now:
                self._lease_refused(lease)
        access = self.access
        wanted = self.desired(now)
        wanted_files = access.files_wanted(wanted)
        by_path = procfs.fd_holders(access.managed)
        listed = self._listed_pids()
        seen_pids = {pid for pids in (*by_path.values(), *listed.values()) for pid in pids}
        holders = {holder.pid: holder for holder in cleanup.describe(sorted(seen_pids)) if not self._protected(holder)}
        live: set[tuple[str, int]] = set()
        for path, pids in by_path.items():
            units = access.units_of_file.get(path) or tuple(unit for unit in (access.owner(path),) if unit)
            for pid in sorted(pids & holders.keys()):
                live.update((unit, pid) for unit in units)  # every unit it serves: a slice's holder on the card's file
                user = holders[pid].user or ""
                if user in wanted_files.get(path, ()) or access.keeps_open(path, user, wanted):
                    continue  # allowed
                self._judge(holders[pid], units)
        for uuid, pids in listed.items():
            for pid in sorted(pids & holders.keys()):
                live.add((uuid, pid))
                if (holders[pid].user or "") not in wanted.get(uuid, ()):
                    self._judge(holders[pid], (uuid,))
        self._violations_seen &= live
        self._unkillable &= live
        self._persist_revocations(now)
        for uuid in list(self.drained):
            if not any(key[0] == uuid for key in self._unkillable):  # what could not be ended is gone now
                self.drained.discard(uuid)
                self.report("drain_cleared", gpu=uuid)
                self._wake.set()  # the leases it held back open now

    def _judge(self, holder: cleanup.Holder, units: tuple[str, ...]) -> None:
        """A process on files (or a list) of ``units`` whose user may not be there: within a grace period (or
        being ended) it is left alone; after one, a leftover to end; otherwise a violation, reported once."""
        if not units:
            return
        user = holder.user or ""
        keys = [(unit, user) for unit in units]
        if any(key in self._cleanups or key in self._cleaning for key in keys):
            return  # a leftover within its grace period (or being ended)
        if any((unit, holder.pid) in self._violations_seen or (unit, holder.pid) in self._unkillable for unit in units):
            return  # reported already (as a violation, or as unkillable)
        revoked = [key for key in keys if key in self._revoked_at]
        if revoked:  # the grace is over: a leftover, ended whatever the policy
            key = max(revoked, key=lambda item: self._revoked_at[item])
            self._cleaning.add(key)
            self._jobs.put(Job("expired", gpu=key[0], user=user))
            return
        self._violations_seen.add((units[0], holder.pid))
        self.report("violation", gpu=units[0], user=holder.user, pid=holder.pid, process=holder.name)
        if self.config.end_violations:
            self._end(units[0], user, [holder])

    def _persist_revocations(self, now: datetime) -> None:
        """Forget revocations older than a day, and write the log when it changed."""
        old = [key for key, at in list(self._revoked_at.items()) if now - at > RECENT_REVOCATION]
        for key in old:
            self._revoked_at.pop(key, None)
        if old or self._revocations_dirty:
            self._revocations_dirty = False
            try:
                self.store.save_revocations(dict(self._revoked_at), secret=self.config.lease_secret)
            except OSError as error:
                log.error("cannot write the revocation log: %s", error)

    def run_due_cleanups(self, now: datetime) -> None:
        """Grace periods that are over go to the checker, which ends what the holder left running."""
        for key in [key for key, deadline in self._cleanups.items() if deadline <= now]:
            self._cleaning.add(key)  # first, so the checker never sees the key in neither place
            del self._cleanups[key]
            self._jobs.put(Job("expired", gpu=key[0], user=key[1]))

    def end_leftovers(self, uuid: str, user: str, now: datetime) -> None:
        """End ``user``'s processes on ``uuid`` unless a lease gives it back to them meanwhile. On a slice: the
        processes holding its capability files or on its backend list; never one that holds only files the
        user still has a lease on (their other slice on the same card, and that card's device file)."""
        try:
            wanted = self.desired(now)
            if user in wanted.get(uuid, ()):
                return
            access = self.access
            wanted_files = access.files_wanted(wanted)
            files = [path for path in access.reach.get(uuid, ()) if user not in wanted_files.get(path, ())]
            by_path = procfs.fd_holders(files)
            pids = {pid for found in by_path.values() for pid in found}
            listed = self._listed_pids()
            pids |= listed.get(uuid, set())
            card = access.cards.get(uuid)
            for item in card.slices if card and card.mode_current else ():
                if user not in wanted.get(item.uuid, ()):
                    pids |= listed.get(item.uuid, set())
            left = [
                holder
                for holder in cleanup.describe(sorted(pids))
                if holder.user == user and not self._protected(holder) and (uuid, holder.pid) not in self._unkillable
            ]
            if left:
                self.report("leftover", gpu=uuid, user=user, pids=[holder.pid for holder in left])
                self._end(uuid, user, left)
        finally:
            self._cleaning.discard((uuid, user))

    def _end(self, uuid: str, user: str, holders: Sequence[cleanup.Holder]) -> None:
        """End ``holders`` (``user``'s processes on ``uuid``). One that outlives every signal, or that the agent
        may not signal at all (it runs with root's privileges: a set-user-ID program such as ``su`` the user
        handed the open device to), keeps the GPU: an incident, reported once per process as ``unkillable``
        with its pid, command and why, and the unit drained until it is gone (``check_holders``)."""
        result = cleanup.terminate([holder.pid for holder in holders])
        if result.ended:
            self.report("ended", gpu=uuid, user=user, pids=sorted(result.ended))
        why = {pid: STUCK_AFTER_SIGNALS for pid in result.unkillable}
        why |= {pid: RUNS_AS_ROOT for pid in result.refused}
        if not why:
            return
        self.drained.add(uuid)
        names = {holder.pid: holder.name for holder in holders}
        for pid in sorted(why):
            self._unkillable.add((uuid, pid))  # reported once: never signalled or reported again while it lives
            log.error("GPU %s drained: pid %d (%s) of %s %s", uuid, pid, names.get(pid), user or "?", why[pid])
            self.report(
                "unkillable",
                gpu=uuid,
                user=user,
                pid=pid,
                pids=[pid],
                process=names.get(pid),
                message=f"pid {pid} ({names.get(pid) or 'unknown command'}) of {user or 'an unknown user'} {why[pid]}",
                drained=True,
            )

    def _report_once(self, kind: str, uuid: str, user: str, message: str) -> None:
        key = (uuid, user, hash((kind, message)))
        if key not in self._failures_seen:
            self._failures_seen.add(key)
            log.error("%s on %s for %r: %s", kind, uuid, user, message)
            self.report(kind, gpu=uuid, user=user or None, message=message)

    # -- threads ----------------------------------------------------------------------------

    def acls_in_force(self) -> dict[str, list[str]]:
        """Per card and current slice, the users it is open to (the heartbeat's ``acls``)."""
        units = self.access.units()
        return {uuid: sorted(self._held.get(uuid, ())) for uuid in units}

    def start(self) -> None:
        for target, name in ((self._loop, "enforcer"), (self._checker, "checker")):
            thread = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads: no pass grants anything from now on. The pool stays for ``revoke_all``; ``close``
        ends it."""
        self._stop.set()
        self._wake.set()
        self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout)

    def close(self) -> None:
        self._pool.shutdown(wait=False)

    def _loop(self) -> None:
        next_full = time.monotonic() + self.config.reconcile_seconds
        while not self._stop.is_set():
            self._wake.clear()
            try:
                now = self.clock()
                if time.monotonic() >= next_full:
                    self.reconcile(now)
                    next_full = time.monotonic() + self.config.reconcile_seconds
                else:
                    self.converge(now)
                self.run_due_cleanups(now)
                self.after_pass()
                wait = self.seconds_to_next_pass(now, next_full - time.monotonic())
            except Exception:  # keep enforcing whatever one pass tripped over
                log.exception("enforcement pass failed")
                wait = 1.0
            self._wake.wait(wait)

    def seconds_to_next_pass(self, enforced_at: datetime, until_reconcile: float) -> float:
        """How long to sleep after a pass that enforced the state at ``enforced_at``.

        The next boundary is looked up from ``enforced_at``, not from a fresh clock reading: a
        boundary that fell while the pass ran is then already due and wakes us at once, instead
        of waiting for the boundary after it (bench/agent.py found that: a 60 ms p99).
        """
        wait = until_reconcile
        boundary = self.next_boundary(enforced_at)
        if boundary is not None:
            wait = min(wait, (boundary - self.clock()).total_seconds())
        return max(wait, self.MIN_WAIT)

    def _checker(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                if job.kind == "check":
                    self._check_pending.clear()
                    self.check_holders(self.clock())
                elif job.kind == "expired":
                    self.end_leftovers(job.gpu, job.user, self.clock())
                elif job.kind == "ledger":
                    self._compact_ledger()
            except Exception:
                log.exception("checker job %s failed", job)
