"""Converging the node to its newest lease snapshot, on the agent's own clock.

Level-triggered and fail-closed (docs/architecture.md): at any moment the GPUs' ACLs must be
exactly what the stored snapshot's leases say for *now*. Two things drive that:

- a timer set for the next boundary (a lease start or end, a cleanup deadline), so a slot
  opens and closes within milliseconds of its time, from the in-memory view of the ACLs;
- a full reconcile every few seconds, which reads the real ACLs back, repairs any drift and
  looks for processes that have no business on a GPU.

Nothing here waits on the portal or the broker: once a snapshot is stored, every end in it
is enforced even if both are gone. The agent never extends a lease by itself.

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
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from gpubook_agent import acl, cleanup, procfs
from gpubook_agent.accounts import CACHE_SECONDS, AccountCheck
from gpubook_agent.config import AgentConfig
from gpubook_agent.gpus import GpuBackend
from gpubook_agent.snapshot import Lease, Snapshot, SnapshotRefused, check_fresh, decode_snapshot, parse_snapshot
from gpubook_agent.store import SnapshotStore, StateFileIgnored

log = logging.getLogger(__name__)

Report = Callable[..., None]  # report(kind, **fields): one event for the portal
RECENT_REVOCATION = timedelta(hours=24)  # how long a revoked holder's processes count as leftovers
REFUSAL_REPORT_INTERVAL = 60.0  # seconds between two reports of the same refusal


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Job:
    """Work for the checker thread: look at who uses each GPU ("check"), or end what an expired
    holder left on a GPU ("expired")."""

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
        self.paths = {gpu.uuid: backend.device_path(gpu.uuid) for gpu in backend.gpus()}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._snapshot: Snapshot | None = None
        self._seen_version = 0  # the newest authentic version received, applied or refused
        self._granted: dict[str, set[str]] = {uuid: set() for uuid in self.paths}
        self._cleanups: dict[tuple[str, str], datetime] = {}  # (gpu, user) -> when to end what is left
        self._cleaning: set[tuple[str, str]] = set()  # handed to the checker, not finished yet
        # Every revocation of the last day, kept on disk: whatever its holder still runs on that GPU
        # after the grace period is a leftover to end (not a mere violation), even after a restart
        # and even if it turns up later (a forked child, a descriptor passed on).
        self._revoked_at: dict[tuple[str, str], datetime] = {}
        self._revocations_dirty = False
        self._refusals_reported: dict[str, float] = {}
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._check_pending = threading.Event()
        self._violations_seen: set[tuple[str, int]] = set()
        self._failures_seen: set[tuple[str, str, int]] = set()
        self._unknown_gpus_seen: set[str] = set()
        self._nvml_pids: dict[str, set[int]] = {}
        self.drained: set[str] = set()
        self._uid_min = procfs.uid_min()
        # The node's own word on who may have a GPU: an account it has, with an ordinary uid.
        self.accounts = accounts or AccountCheck(uid_min=self._uid_min, protected=config.protected_users)
        self._refused_leases: set[tuple[int, str]] = set()  # reported already
        self._threads: list[threading.Thread] = []
        # Changes to different GPUs run side by side; each touches only its own GPU's state.
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="agent-acl")

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

    # -- what should be ---------------------------------------------------------------------

    def desired(self, now: datetime) -> dict[str, set[str]]:
        """For each GPU of this node, the users whose lease covers ``now``."""
        wanted: dict[str, set[str]] = {uuid: set() for uuid in self.paths}
        snapshot = self._snapshot
        for lease in snapshot.leases if snapshot else ():
            if not lease.active_at(now):
                continue
            if self._lease_refused(lease, max_age=math.inf):
                # Refusing blocks a grant, never takes one back: NSS answers "no such user" when
                # its directory is unreachable, and that must not end a running slot's jobs.
                for uuid in lease.gpus:
                    if lease.user in self._granted.get(uuid, ()):
                        wanted[uuid].add(lease.user)
                continue
            for uuid in lease.gpus:
                if uuid in wanted:
                    wanted[uuid].add(lease.user)
                elif uuid not in self._unknown_gpus_seen:
                    self._unknown_gpus_seen.add(uuid)
                    self.report("unknown_gpu", gpu=uuid, user=lease.user, reservation=lease.reservation)
        return wanted

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
        """Apply the difference between the wanted ACLs and the ones in force.

        Boundaries often fall together (a hand-over is an end and a start; many slots start on
        the hour), and each setfacl is a process: so each GPU's changes go in one call, and GPUs
        are changed side by side.
        """
        wanted = self.desired(now)
        changes: list[tuple[str, list[str], list[str]]] = []  # (GPU, revokes, grants)
        for uuid, users in wanted.items():
            revokes, grants = sorted(self._granted[uuid] - users), sorted(users - self._granted[uuid])
            if revokes or grants:
                changes.append((uuid, revokes, grants))
        if len(changes) == 1:
            self._change(*changes[0], now)
        elif changes:

            def change(planned: tuple[str, list[str], list[str]]) -> None:
                self._change(*planned, now)

            list(self._pool.map(change, changes))

    def revoke_all(self) -> None:
        """On a clean stop: take every grant back. With no agent running nothing would end a slot,
        so a stopped agent leaves the GPUs closed (fail closed); a restart restores what the stored
        snapshot allows within a second."""
        now = self.clock()
        for uuid, path in self.paths.items():
            try:
                users = acl.granted_users(path)
            except acl.AclError as error:
                log.error("cannot read %s to revoke it: %s", path, error)
                continue
            if users:
                self._change(uuid, sorted(users), [], now)
        self._persist_revocations(now)

    def _change(self, uuid: str, revokes: list[str], grants: list[str], now: datetime) -> None:
        """One GPU's revokes and grants together; if that fails, one at a time, revokes first, so
        a name the node does not know never holds up a revocation."""
        try:
            acl.change(self.paths[uuid], revoke=revokes, grant=grants)
        except acl.AclError:
            for user in revokes:
                self._revoke(uuid, user, now)
            for user in grants:
                self._grant(uuid, user, now)
            return
        for user in revokes:
            self._revoked(uuid, user, now)
        for user in grants:
            self._granted_to(uuid, user, now)

    def reconcile(self, now: datetime) -> None:
        """Read the real ACLs back and converge; then have the checker look at who uses each GPU."""
        for uuid, path in self.paths.items():
            try:
                self._granted[uuid] = acl.granted_users(path)
            except acl.AclError as error:
                self._report_once("acl_error", uuid, "", f"cannot read the ACL of {path}: {error}")
        self.converge(now)
        if not self._check_pending.is_set():  # one check waiting is enough
            self._check_pending.set()
            self._jobs.put(Job("check"))

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
                    self._revoked_at.setdefault((uuid, lease.user), lease.end)
        grace = timedelta(seconds=self.config.grace_seconds)
        for key, at in self._revoked_at.items():
            if at + grace > now and key[0] in self.paths:
                self._cleanups[key] = at + grace
        self.reconcile(now)

    def _grant(self, uuid: str, user: str, now: datetime) -> None:
        try:
            acl.grant(self.paths[uuid], user)
        except acl.AclError as error:
            self._report_once("grant_failed", uuid, user, str(error))
            return
        self._granted_to(uuid, user, now)

    def _granted_to(self, uuid: str, user: str, now: datetime) -> None:
        self._granted[uuid].add(user)
        self._cleanups.pop((uuid, user), None)
        self.report("granted", gpu=uuid, user=user, **self._lease_fields(uuid, user, now, starting=True))

    def _revoke(self, uuid: str, user: str, now: datetime) -> None:
        try:
            acl.revoke(self.paths[uuid], user)
        except acl.AclError as error:
            self._report_once("revoke_failed", uuid, user, str(error))
            return
        self._revoked(uuid, user, now)

    def _revoked(self, uuid: str, user: str, now: datetime) -> None:
        self._granted[uuid].discard(user)
        if not user.isdigit():  # an entry left for a deleted account has no processes to end
            self._cleanups[(uuid, user)] = now + timedelta(seconds=self.config.grace_seconds)
            self._revoked_at[(uuid, user)] = now
            self._revocations_dirty = True  # written by the checker, off the boundary path
        self.report("revoked", gpu=uuid, user=user, **self._lease_fields(uuid, user, now, starting=False))

    def _lease_fields(self, uuid: str, user: str, now: datetime, *, starting: bool) -> dict[str, Any]:
        """The reservation and boundary behind a change, when a lease explains it (for reports and bench)."""
        snapshot = self._snapshot
        best = None
        for lease in snapshot.leases if snapshot else ():
            if lease.user == user and uuid in lease.gpus:
                boundary = lease.start if starting else lease.end
                if boundary <= now and (best is None or boundary > best[1]):
                    best = (lease.reservation, boundary)
        if best is None:
            return {}
        return {"reservation": best[0], "boundary": best[1].isoformat()}

    # -- processes --------------------------------------------------------------------------

    def note_gpu_processes(self, pids_by_gpu: dict[str, set[int]]) -> None:
        """Pids NVML lists per GPU (from the telemetry sampler), joined with the /proc scan."""
        self._nvml_pids = pids_by_gpu

    def holders(self) -> dict[str, list[cleanup.Holder]]:
        """Processes on each GPU: the device file held open, or listed by the GPU backend."""
        by_path = procfs.fd_holders(self.paths.values())
        found: dict[str, list[cleanup.Holder]] = {}
        for uuid, path in self.paths.items():
            pids = by_path.get(path, set()) | self._nvml_pids.get(uuid, set())
            found[uuid] = [holder for holder in cleanup.describe(sorted(pids)) if not self._protected(holder)]
        return found

    def _protected(self, holder: cleanup.Holder) -> bool:
        return cleanup.protected(
            holder, allow_users=self.config.protected_users, own_pid=os.getpid(), uid_min=self._uid_min
        )

    def check_holders(self, now: datetime) -> None:
        """Report (and, by policy, end) processes on a GPU whose user holds no lease on it. First,
        off the boundary path, look the leases' accounts up again where the answer is a minute old."""
        snapshot = self._snapshot
        for lease in snapshot.leases if snapshot else ():
            if lease.end > now:
                self._lease_refused(lease)
        wanted = self.desired(now)
        live: set[tuple[str, int]] = set()
        for uuid, holders in self.holders().items():
            for holder in holders:
                live.add((uuid, holder.pid))
                key = (uuid, holder.user or "")
                if holder.user in wanted[uuid] or key in self._cleanups or key in self._cleaning:
                    continue  # allowed, or a leftover within its grace period (or being ended)
                if (uuid, holder.pid) in self._violations_seen:
                    continue  # reported already (as a violation, or as unkillable)
                if key in self._revoked_at:  # the grace is over: a leftover, ended whatever the policy
                    self._cleaning.add(key)
                    self._jobs.put(Job("expired", gpu=uuid, user=key[1]))
                    continue
                self._violations_seen.add((uuid, holder.pid))
                self.report("violation", gpu=uuid, user=holder.user, pid=holder.pid, process=holder.name)
                if self.config.end_violations:
                    self._end(uuid, holder.user or "", (holder.pid,))
        self._violations_seen &= live
        self._persist_revocations(now)
        for uuid in list(self.drained):
            if not any(key[0] == uuid for key in live):
                self.drained.discard(uuid)
                self.report("drain_cleared", gpu=uuid)

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
        """End ``user``'s processes on ``uuid`` unless a lease gives it back to them meanwhile."""
        try:
            if user in self.desired(now)[uuid]:
                return
            pids = tuple(holder.pid for holder in self.holders()[uuid] if holder.user == user)
            if pids:
                self.report("leftover", gpu=uuid, user=user, pids=list(pids))
                self._end(uuid, user, pids)
        finally:
            self._cleaning.discard((uuid, user))

    def _end(self, uuid: str, user: str, pids: tuple[int, ...]) -> None:
        result = cleanup.terminate(pids)
        if result.ended:
            self.report("ended", gpu=uuid, user=user, pids=sorted(result.ended))
        if result.unkillable:
            self.drained.add(uuid)
            self._violations_seen.update((uuid, pid) for pid in result.unkillable)  # reported as unkillable
            self.report("unkillable", gpu=uuid, user=user, pids=sorted(result.unkillable), drained=True)

    def _report_once(self, kind: str, uuid: str, user: str, message: str) -> None:
        key = (uuid, user, hash((kind, message)))
        if key not in self._failures_seen:
            self._failures_seen.add(key)
            log.error("%s on %s for %r: %s", kind, uuid, user, message)
            self.report(kind, gpu=uuid, user=user or None, message=message)

    # -- threads ----------------------------------------------------------------------------

    def acls_in_force(self) -> dict[str, list[str]]:
        return {uuid: sorted(users) for uuid, users in self._granted.items()}

    def start(self) -> None:
        for target, name in ((self._loop, "enforcer"), (self._checker, "checker")):
            thread = threading.Thread(target=target, name=f"agent-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._jobs.put(None)
        for thread in self._threads:
            thread.join(timeout)
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
            except Exception:
                log.exception("checker job %s failed", job)
