from __future__ import annotations

import pytest

from gpubook_agent.signing import signed, verify

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


@pytest.mark.parametrize(
    "signature",
    [
        "é" * 64,  # non-ASCII: hmac.compare_digest raises TypeError on it
        "ü" + "0" * 63,
        "z" * 64,  # not hex
        "0" * 63,  # one short
        "0" * 65,
        "0" * 64 + "\n",  # a trailing newline that $ would let through
    ],
)
def test_a_signature_that_is_not_64_hex_digits_is_refused_not_raised(signature):
    assert not verify({**SNAPSHOT, "signature": signature}, "s3cret")


def test_the_right_signature_in_upper_case_is_refused():
    """sign() writes lower case; there is one spelling of a signature, the one compared."""
    snapshot = signed(SNAPSHOT, "s3cret")
    assert not verify({**snapshot, "signature": snapshot["signature"].upper()}, "s3cret")
