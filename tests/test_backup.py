"""A backup restores: docs/operations.md's pg_dump and pg_restore commands, run as written, bring a portal back on a
fresh database with everything a lab would miss. A portal process on the restored database knows the researcher's
API token and calendar feed (with the same SECRET_KEY, kept with the backup), shows the booking as it was, and
answers the node's agent with a snapshot the agent's own code verifies with the lease secret in its config and
accepts as newer than anything it saw before the restore."""

# Tests run fixed argument lists (never a shell).
# ruff: noqa: S603

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import requests
from django.db import connection
from django.utils import timezone

from accounts.services import api_token_create
from feeds.selectors import feed_links
from gpubook_agent import protocol
from gpubook_agent.snapshot import MAX_SNAPSHOT_BYTES, SnapshotRefused, check_fresh, decode_snapshot, parse_snapshot
from nodes.services import node_register
from reservations.leases import node_snapshot
from reservations.services import reservation_create
from tests.agent.portal_client import agent_client
from tests.databases import current_database_url, scratch_database
from tests.factories import GpuFactory
from tests.live.server import AsgiServer

pytestmark = [
    pytest.mark.postgres_only,
    pytest.mark.skipif(connection.vendor != "postgresql", reason="pg_dump and pg_restore are PostgreSQL's"),
    pytest.mark.django_db(transaction=True),  # committed, so that pg_dump sees it
]

ROOT = Path(__file__).resolve().parent.parent


def shell(*command: str, **environment: str) -> str:
    """Run ``command`` here (with ``environment`` over this one); its output. It must succeed."""
    done = subprocess.run(
        command,
        cwd=ROOT,
        env={**os.environ, **environment},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, f"{' '.join(command[:2])}: {done.stderr[-2000:]}"
    return done.stdout + done.stderr


def test_a_pg_dump_restored_into_a_fresh_database_serves_bookings_tokens_feeds_and_signed_leases(
    alice, tmp_path, settings
):
    credentials = node_register(name="gpu-backup", hostname="backup.lab")
    gpus = [GpuFactory(node=credentials.node, index=index) for index in range(2)]
    start = timezone.now().replace(second=0, microsecond=0) + timedelta(hours=1)
    booking = reservation_create(
        user=alice, gpus=[gpus[1]], start=start, end=start + timedelta(hours=2), purpose="kept"
    )
    _, token = api_token_create(user=alice, name="backup check")
    feed_path = feed_links(user=alice)[0].path
    dump = tmp_path / "gpubook.dump"

    # docs/operations.md, "Backups": the daily dump, then the restore into an empty database and migrate.
    shell("pg_dump", "--format=custom", f"--file={dump}", current_database_url())
    # The node's agent goes on seeing snapshots after the dump: the restored database's counter is behind them.
    seen_by_the_agent = node_snapshot(node=credentials.node, now=timezone.now())["version"]
    with scratch_database() as restored:
        shell("pg_restore", "--clean", "--if-exists", "--dbname", restored, str(dump))
        migrated = shell(sys.executable, "manage.py", "migrate", "--noinput", DATABASE_URL=restored)
        assert "No migrations to apply" in migrated

        portal = AsgiServer(DATABASE_URL=restored)  # the same SECRET_KEY: kept with the backup
        portal.start()
        try:
            api = requests.get(
                f"{portal.url}/api/v1/reservations/{booking.pk}/",
                headers={"Authorization": f"Bearer {token}"},
                timeout=30,
            )
            assert api.status_code == 200, api.text
            shown = api.json()
            assert (shown["status"], shown["purpose"], shown["user"]) == (booking.status, "kept", "alice")
            assert _parsed(shown["start"]) == booking.start and _parsed(shown["end"]) == booking.end
            assert [gpu["uuid"] for gpu in shown["gpus"]] == [gpus[1].uuid]

            feed = requests.get(f"{portal.url}{feed_path}", timeout=30)
            assert feed.status_code == 200 and "kept" in feed.text

            agent = agent_client(portal.url, "gpu-backup", credentials.lease_secret, credentials.agent_token)
            body = agent.fetch(protocol.SNAPSHOT, limit=MAX_SNAPSHOT_BYTES)  # the node token, hashed in the dump
        finally:
            portal.stop()

    snapshot = parse_snapshot(decode_snapshot(body), node_name="gpu-backup", secret=credentials.lease_secret)
    check_fresh(snapshot, now=datetime.now(UTC), max_age_seconds=60)
    assert snapshot.version > seen_by_the_agent  # the agent takes it: never older than what it has
    (lease,) = snapshot.leases
    assert (lease.reservation, lease.user, lease.gpus) == (booking.pk, alice.unix_username, (gpus[1].uuid,))
    assert (lease.start, lease.end) == (booking.start, booking.end)
    with pytest.raises(SnapshotRefused, match="signature"):  # the control: another secret verifies nothing
        parse_snapshot(decode_snapshot(body), node_name="gpu-backup", secret="0" * 64)


def _parsed(value: str) -> datetime:
    return datetime.fromisoformat(value)
