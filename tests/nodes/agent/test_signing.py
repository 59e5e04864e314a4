from __future__ import annotations

from nodes.agent.signing import signed, verify

SNAPSHOT = {"node": "gpu-a100", "version": 7, "leases": [{"user": "alice", "gpus": ["GPU-1"], "end": "x"}]}


def test_a_signed_snapshot_verifies_with_its_secret_only():
    snapshot = signed(SNAPSHOT, "s3cret")
    assert verify(snapshot, "s3cret")
    assert not verify(snapshot, "other")
    assert not verify(snapshot, "")


def test_any_change_breaks_the_signature():
    snapshot = signed(SNAPSHOT, "s3cret")
    for tampered in (
        {**snapshot, "version": 8},
        {**snapshot, "leases": [{**SNAPSHOT["leases"][0], "user": "mallory"}]},
        {**snapshot, "extra": True},
        {key: value for key, value in snapshot.items() if key != "signature"},
        {**snapshot, "signature": None},
    ):
        assert not verify(tampered, "s3cret")


def test_key_order_does_not_matter():
    snapshot = signed(SNAPSHOT, "s3cret")
    reordered = dict(reversed(list(snapshot.items())))
    assert verify(reordered, "s3cret")
