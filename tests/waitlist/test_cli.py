"""``gpubook wait``, ``waitlist``, ``claim``, ``leave``: a real subprocess against a live portal (tests/test_cli.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from reservations.services import reservation_cancel, reservation_create
from tests.factories import node_with_gpus
from tests.test_cli import assert_clean_failure, cli_for, iso, start  # noqa: F401 - fixtures
from waitlist.models import Entry

pytestmark = pytest.mark.django_db(transaction=True)


def test_wait_list_claim_and_the_hint_after_a_refused_booking(cli_for, alice, bob, start):  # noqa: F811
    gpu = node_with_gpus(2, name="gpu-a100").gpus.order_by("index").first()
    taken = reservation_create(user=bob, gpus=[gpu], start=start, end=start + timedelta(hours=2))
    run = cli_for(alice)

    refused = run("book", "--gpu-ids", gpu.pk, "--start", iso(start), "--hours", "2")
    assert_clean_failure(refused, 1)
    assert f"to wait for it: gpubook wait --gpu-ids {gpu.pk}" in refused.stderr

    until = start + timedelta(hours=2)
    joined = run("wait", "--gpu-ids", gpu.pk, "--from", iso(start), "--until", iso(until), "--hours", "2", "--claim")
    assert joined.returncode == 0, joined.stderr
    entry = Entry.objects.get()
    assert joined.stdout.startswith(f"Joined the waitlist: #{entry.pk} gpu-a100/GPU 0 for 2 h: waiting")

    listed = run("waitlist")
    assert "gpu-a100/GPU 0 for 2 h" in listed.stdout and "number 1 in the queue" in listed.stdout

    reservation_cancel(reservation=taken, actor=bob)  # committed: the offer is made and mailed
    listed = run("waitlist")
    assert "held until" in listed.stdout and f"gpubook claim {entry.pk}" in listed.stdout
    claimed = run("claim", entry.pk)
    assert claimed.returncode == 0, claimed.stderr
    assert claimed.stdout.startswith(f"Claimed: #{entry.pk} gpu-a100/GPU 0 for 2 h: booked: reservation #")

    assert_clean_failure(run("leave", entry.pk), 1)  # booked already
    other = run(
        "wait", "--node", "gpu-a100", "--count", "1", "--from", iso(start), "--until", iso(until), "--hours", "2"
    )
    assert other.returncode == 0, other.stderr  # GPU 1 is free: booked at once
    assert ": booked: reservation #" in other.stdout
