"""Is beat alive? Every periodic job records its last success, and a late one is an alert.

Each run beat starts carries the name of its schedule entry in a message header (``tag_schedule``,
applied to the whole ``beat_schedule`` in portal/celery.py). When such a run succeeds, the worker
records it (Celery's ``task_success`` signal -> ``job_succeeded``, a compare-and-swap upsert of
``PeriodicJob``). It is keyed by the schedule's entries, so a job added there is watched with no more
code; the same task run another way (staff mail nudged when an alert opens) does not count, for only
beat's runs say that beat is alive.

A job is late when its last success, or before its first one the moment the portal started watching
it, is more than LATE_PERIODS periods old, and at least LATE_AT_LEAST (so that a 10-second job is
not called late for a beat restart). Agent heartbeats check (alerts.conditions.alerts_check_jobs_if_due,
at most every JOBS_LATE_CHECK_SECONDS per process): a path that does not depend on beat.

This module is imported by portal/celery.py before Django is set up: models are imported where used.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import pairwise
from typing import Any

logger = logging.getLogger(__name__)

HEADER = "periodic_job"
LATE_PERIODS = 3
LATE_AT_LEAST = timedelta(minutes=2)
# A schedule of another sort (celery's solar, a custom one) is watched as a daily job.
UNMEASURED_PERIOD = timedelta(days=1)


def tag_schedule(schedule: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Give every entry's runs the header naming the entry (in place; returns the schedule)."""
    for name, entry in schedule.items():
        options = entry.setdefault("options", {})
        options["headers"] = {**options.get("headers", {}), HEADER: name}
    return schedule


def period_of(schedule: Any) -> timedelta:
    """How often an entry's ``schedule`` runs: seconds, a timedelta, celery's ``schedule``, or for a
    crontab the longest gap between two of its runs over the coming five weeks."""
    if isinstance(schedule, int | float):
        return timedelta(seconds=schedule)
    if isinstance(schedule, timedelta):
        return schedule
    run_every = getattr(schedule, "run_every", None)
    if isinstance(run_every, timedelta):
        return run_every
    fields = ("minute", "hour", "day_of_week", "day_of_month", "month_of_year")
    if all(isinstance(getattr(schedule, name, None), set) for name in fields):
        return _crontab_period(*(frozenset(getattr(schedule, name)) for name in fields))
    return UNMEASURED_PERIOD


@lru_cache(maxsize=64)
def _crontab_period(
    minutes: frozenset[int],
    hours: frozenset[int],
    weekdays: frozenset[int],
    days: frozenset[int],
    months: frozenset[int],
) -> timedelta:
    start = datetime(2026, 1, 1, tzinfo=UTC)  # any start will do: the longest gap is what counts
    runs = []
    for step in range(35 * 24 * 60):
        moment = start + timedelta(minutes=step)
        if (
            moment.minute in minutes
            and moment.hour in hours
            and moment.isoweekday() % 7 in weekdays  # celery: 0 is Sunday
            and moment.day in days
            and moment.month in months
        ):
            runs.append(moment)
    if len(runs) < 2:
        return timedelta(days=31)  # monthly or rarer
    return max(later - earlier for earlier, later in pairwise(runs))


def schedule_entries() -> dict[str, tuple[str, timedelta]]:
    """Beat's schedule as the portal's Celery app has it: entry name -> (task, period)."""
    from celery import current_app

    return {
        name: (entry.get("task", ""), period_of(entry.get("schedule")))
        for name, entry in (current_app.conf.beat_schedule or {}).items()
    }


@dataclass(frozen=True)
class JobState:
    name: str
    task: str
    period: timedelta
    last_success_at: datetime | None
    watched_since: datetime | None

    def age(self, now: datetime) -> timedelta | None:
        """Time since the last success; None if it never succeeded."""
        return None if self.last_success_at is None else max(now - self.last_success_at, timedelta(0))

    def waited(self, now: datetime) -> timedelta | None:
        """Time since the last success, or since the job was first watched; None if neither is known."""
        since = self.last_success_at or self.watched_since
        return None if since is None else max(now - since, timedelta(0))

    def late_after(self) -> timedelta:
        return max(self.period * LATE_PERIODS, LATE_AT_LEAST)

    def is_late(self, now: datetime) -> bool:
        waited = self.waited(now)
        return waited is not None and waited > self.late_after()


def job_states(*, now: datetime, watch_new: bool = False) -> list[JobState]:
    """Every entry of the schedule with its record (one query); with ``watch_new``, entries never
    seen before start being watched from ``now`` (one insert, the first time only)."""
    from alerts.models import PeriodicJob

    entries = schedule_entries()
    records = {job.name: job for job in PeriodicJob.objects.filter(name__in=list(entries))}
    missing = [name for name in entries if name not in records]
    if watch_new and missing:
        PeriodicJob.objects.bulk_create(
            [PeriodicJob(name=name, task=entries[name][0], watched_since=now) for name in missing],
            ignore_conflicts=True,
        )
        records |= {job.name: job for job in PeriodicJob.objects.filter(name__in=missing)}
    states = []
    for name, (task, period) in sorted(entries.items()):
        record = records.get(name)
        states.append(
            JobState(
                name=name,
                task=task,
                period=period,
                last_success_at=record.last_success_at if record else None,
                watched_since=record.watched_since if record else None,
            )
        )
    return states


def job_succeeded(*, name: str, task: str, now: datetime) -> None:
    """Record a successful run of the entry ``name``; never moves a later record back."""
    from django.db.models import Q

    from alerts.models import PeriodicJob

    newer = Q(last_success_at__isnull=True) | Q(last_success_at__lt=now)
    if PeriodicJob.objects.filter(newer, name=name).update(last_success_at=now, task=task):
        return
    PeriodicJob.objects.get_or_create(name=name, defaults={"task": task, "last_success_at": now, "watched_since": now})


def on_task_success(sender: Any = None, **kwargs: Any) -> None:
    """Celery's ``task_success``, in the worker: a run beat started has succeeded."""
    name = getattr(getattr(sender, "request", None), HEADER, None)
    if not name or not isinstance(name, str):
        return
    from django.utils import timezone

    try:
        job_succeeded(name=name[:200], task=sender.name, now=timezone.now())
    except Exception:  # the job did its work: a failed record never fails it
        logger.exception("could not record the success of periodic job %s", name)
