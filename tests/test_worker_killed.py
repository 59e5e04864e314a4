"""A Celery worker killed mid-task leaves nothing half-done (portal/settings.py: tasks acknowledged late, the short
bounded ones given back when their pool process is lost; docs/operations.md, "A worker killed mid-task"). Real
workers in processes of their own, on the test database and Redis, SIGKILLed while a task is in the middle of its
work:

- a pool process killed while it pushes a node its leases (as the OOM killer would): the push is given back at once,
  a new pool process sends the node its whole state, and the dead one's half-done transaction is gone;
- a pool process killed in beat's push to every node: that job is not given back (one that kills its process every
  time would come back forever), and the worker goes on with the next task;
- a whole worker killed while it sends a booking's mail to the SMTP server: the mail goes once, sent by the worker
  that replaced it once the dead one's claim expired, and never twice.
"""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone

from alerts.models import PeriodicJob
from gpubook_agent.signing import verify
from nodes.models import Node
from nodes.services import node_register
from notifications.models import Notification
from reservations import pushes
from reservations.pushes import push_all_leases, push_node_leases
from reservations.services import reservation_create
from reservations.timegrid import ceil_to_grid
from tests.agent.harness import wait_for
from tests.factories import UserFactory
from tests.live.server import database_url
from tests.mailserver import received_at, subject_of
from tests.nodes.queues import messages, purge

ROOT = Path(__file__).resolve().parents[1]
# kombu keeps the messages a worker holds unacknowledged here (Redis transport).
UNACKED = ("unacked", "unacked_index")

pytestmark = [pytest.mark.postgres_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the workers share the test database: PostgreSQL")


@pytest.fixture
def empty_queues():
    purge("celery", *UNACKED)
    yield
    purge("celery", *UNACKED)


def environment(**extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": settings.SECRET_KEY,
        **extra,
    }


@contextmanager
def celery(*args: str, log: Path, **env: str) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "portal", *args, "--loglevel", "INFO"],
            cwd=ROOT,
            env=environment(**env),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def worker(log: Path, *options: str, **env: str):
    return celery("worker", "--without-mingle", "--without-gossip", *options, log=log, **env)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (a prefork worker's pool)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def waiting_on_a_lock() -> list[int]:
    """The backends of the test database waiting for a lock (the pool process's, stopped mid-transaction). From a
    connection of its own, outside any transaction: pg_stat_activity is read once per transaction."""
    with psycopg.connect(database_url(), autocommit=True) as watcher:
        rows = watcher.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchall()
    return [row[0] for row in rows]


@contextmanager
def pool_killed_mid_task(
    node: Node, send: Callable[[], object], log: Path
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A prefork worker with one pool process; ``send`` queues a task that stops inside its transaction on ``node``'s
    row, which the test holds; the pool process is SIGKILLed there, mid-task and mid-transaction, as the OOM killer
    would, and the row let go. Yields the worker and the dead pool process's pid, the worker still running."""
    holder = psycopg.connect(database_url())
    try:
        holder.execute("SELECT 1 FROM nodes_node WHERE id = %s FOR UPDATE", [node.pk])
        with worker(log, "--pool", "prefork", "--concurrency", "1") as process:
            assert wait_for(lambda: "ready." in log.read_text(), timeout=60), log.read_text()
            (pool,) = children(process.pid)
            send()
            assert wait_for(waiting_on_a_lock, timeout=30, interval=0.1), log.read_text()

            os.kill(pool, signal.SIGKILL)
            assert wait_for(lambda: "WorkerLostError" in log.read_text(), timeout=30), log.read_text()
            holder.rollback()  # the row is free again
            yield process, pool
    finally:
        holder.close()


def test_a_pool_process_killed_mid_push_gives_the_push_back_and_a_new_one_sends_the_whole_state(tmp_path, empty_queues):
    credentials = node_register(name="gpu-kill", hostname="kill.lab")
    node = credentials.node
    gpu = node.gpus.create(index=0, uuid="GPU-kill-0", model="NVIDIA A100", memory_mib=81920)
    alice = UserFactory(username="alice")
    start = ceil_to_grid(timezone.now() + timedelta(hours=1))
    reservation_create(user=alice, gpus=[gpu], start=start, end=start + timedelta(hours=2))
    queue = f"node.{node.name}"
    # The booking queued its own push and mail: this test sends the one push it watches.
    purge("celery", queue, pushes.PENDING_KEY.format(node_id=node.pk))
    log = tmp_path / "worker.log"
    try:
        # The test holds the node's row, so the push stops inside its transaction, after its first write.
        with pool_killed_mid_task(node, lambda: push_node_leases.apply_async((node.pk,)), log) as (process, pool):
            assert wait_for(lambda: messages(queue), timeout=60), log.read_text()
            assert wait_for(lambda: "succeeded" in log.read_text(), timeout=30), log.read_text()
            assert children(process.pid) not in ([], [pool])  # a new pool process ran it
        sent_messages = messages(queue)
    finally:
        purge(queue, pushes.PENDING_KEY.format(node_id=node.pk))

    (sent,) = sent_messages
    snapshot = json.loads(sent["args"][0])
    node = Node.objects.get(pk=node.pk)
    assert verify(snapshot, node.lease_secret)
    # What the node got is what the database says: the dead process's version, issued in a transaction that never
    # committed, is not the node's.
    assert snapshot["version"] == node.lease_version
    assert [(lease["user"], lease["start"]) for lease in snapshot["leases"]] == [("alice", start.isoformat())]


def test_a_periodic_job_killed_with_its_pool_process_is_left_to_its_next_run(tmp_path, empty_queues):
    """Beat's jobs are not given back (portal/settings.py): one that kills its process every time (an OOM in a large
    prune) would otherwise come back at once, forever, and starve the worker; beat runs it again anyway."""
    credentials = node_register(name="gpu-beat", hostname="beat.lab")
    node = credentials.node
    queue = f"node.{node.name}"
    purge(queue, pushes.PENDING_KEY.format(node_id=node.pk))
    log = tmp_path / "worker.log"
    try:
        # Beat's push to every node stops inside its transaction, on the node's row the test holds.
        with pool_killed_mid_task(node, push_all_leases.apply_async, log):
            # A task sent after the kill, behind where a given-back job would be: once it has run, so would that.
            push_node_leases.apply_async((node.pk,))
            assert wait_for(lambda: "succeeded" in log.read_text(), timeout=60), log.read_text()
        written = log.read_text()
        sent_messages = messages(queue)
    finally:
        purge(queue, pushes.PENDING_KEY.format(node_id=node.pk))

    assert len(re.findall(r"nodes\.push_all_leases\[[^\]]+\] received", written)) == 1, written  # never again
    assert not re.search(r"nodes\.push_all_leases\[[^\]]+\] succeeded", written), written
    assert len(sent_messages) == 1  # the later push's alone


def test_a_worker_killed_while_it_sends_a_mail_leaves_it_to_be_sent_once_by_the_next(
    smtp_server, alice, gpus, tmp_path, empty_queues
):
    claim = 4  # NOTIFY_CLAIM_SECONDS for the workers (the production default is 300)
    env = {
        "EMAIL_URL": f"smtp://127.0.0.1:{smtp_server.port}",
        "NOTIFY_CLAIM_SECONDS": str(claim),
        "NOTIFY_SCAN_SECONDS": "1",
    }
    smtp_server.hold()  # the first sender waits after naming its recipient: mid-mail, nothing taken yet
    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    with celery("beat", "--schedule", str(tmp_path / "beat-schedule"), log=tmp_path / "beat.log", **env):
        with worker(first_log, "--pool", "solo", **env) as first:
            drained = PeriodicJob.objects.filter(name="send-due-mail", last_success_at__isnull=False)
            assert wait_for(drained.exists, timeout=60, interval=0.2), first_log.read_text()

            start = ceil_to_grid(timezone.now() + timedelta(days=1))
            reservation_create(user=alice, gpus=[gpus[0]], start=start, end=start + timedelta(hours=1))
            assert wait_for(lambda: smtp_server.held == 1, timeout=30), first_log.read_text()
            first.kill()  # SIGKILL, mid-mail
            first.wait()
        smtp_server.release()
        note = Notification.objects.get()
        assert note.sent_at is None and note.claimed_until is not None and note.attempts == 1
        claimed_until = note.claimed_until  # the dead worker's claim, as the database holds it

        with worker(second_log, "--pool", "solo", **env):
            mails = smtp_server.wait_for(1, timeout=60)
            assert len(mails) == 1, second_log.read_text()
            later = PeriodicJob.objects.filter(
                name="send-due-mail", last_success_at__gt=timezone.now() + timedelta(seconds=3)
            )
            assert wait_for(later.exists, timeout=60, interval=0.2), (
                second_log.read_text()
            )  # more drains, a second apart
    assert len(smtp_server.messages) == 1  # once: not by the dead worker, not twice by the next
    assert subject_of(mails[0]).startswith("Booked: gpu-a100 GPU 0")
    # It waited for the dead worker's claim to expire: the SMTP server took the mail only after it.
    assert received_at(mails[0]) >= claimed_until
    note.refresh_from_db()
    assert note.sent_at is not None and note.attempts == 2 and note.last_error == ""
