"""Checking a lease snapshot before the agent believes it: whole, signed, addressed here, well formed."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from gpubook_agent.signing import signed
from gpubook_agent.snapshot import (
    MAX_SNAPSHOT_BYTES,
    MAX_SNAPSHOT_DEPTH,
    Lease,
    SnapshotRefused,
    check_fresh,
    decode_snapshot,
    json_depth,
    parse_snapshot,
)

NODE = "gpu-a100"
SECRET = "s3cret"
GPU_0 = "GPU-5b3a8f0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"
GPU_1 = "GPU-0f1e2d3c-4b5a-6978-8a9b-aabbccddeeff"
START = datetime(2030, 5, 6, 9, 0, tzinfo=UTC)
END = START + timedelta(hours=2)


def lease(**changes: Any) -> dict[str, Any]:
    return {
        "reservation": 42,
        "user": "alice",
        "gpus": [GPU_0, GPU_1],
        "start": START.isoformat(),
        "end": END.isoformat(),
        **changes,
    }


def body(**changes: Any) -> dict[str, Any]:
    return {
        "node": NODE,
        "version": 3,
        "issued_at": (START - timedelta(days=1)).isoformat(),
        "horizon_end": (START + timedelta(days=1)).isoformat(),
        "leases": [lease()],
        **changes,
    }


def parse(raw: Any) -> Any:
    return parse_snapshot(raw, node_name=NODE, secret=SECRET)


def refused(raw: Any) -> str:
    with pytest.raises(SnapshotRefused) as raised:
        parse(raw)
    return str(raised.value)


def test_a_valid_signed_snapshot_is_accepted():
    raw = signed(body(leases=[lease(), lease(reservation=43, user="bob", gpus=[GPU_1])]), SECRET)

    snapshot = parse(raw)

    assert snapshot.node == NODE
    assert snapshot.version == 3
    assert snapshot.issued_at == START - timedelta(days=1)
    assert snapshot.raw is raw  # stored as received, signature included, so it can be verified again
    assert snapshot.leases == (
        Lease(reservation=42, user="alice", gpus=(GPU_0, GPU_1), start=START, end=END),
        Lease(reservation=43, user="bob", gpus=(GPU_1,), start=START, end=END),
    )
    for item in snapshot.leases:
        assert item.start.tzinfo is not None
        assert item.end.tzinfo is not None


def test_an_empty_lease_list_is_a_valid_snapshot():
    assert parse(signed(body(leases=[]), SECRET)).leases == ()


def test_other_offsets_and_mig_devices_are_accepted():
    plus_two = timezone(timedelta(hours=2))
    mig = "MIG-7c8d9e0f-1a2b-3c4d-5e6f-708192a3b4c5"
    raw = signed(body(leases=[lease(gpus=[mig], start=START.astimezone(plus_two).isoformat())]), SECRET)

    (accepted,) = parse(raw).leases

    assert accepted.start == START
    assert accepted.start.utcoffset() == timedelta(hours=2)


def test_the_idle_power_cap_is_off_unless_the_snapshot_names_one():
    assert parse(signed(body(), SECRET)).idle_power_limit_pct is None  # a portal before the cap
    assert parse(signed(body(idle_power_limit_pct=None), SECRET)).idle_power_limit_pct is None
    assert parse(signed(body(idle_power_limit_pct=40), SECRET)).idle_power_limit_pct == 40
    assert parse(signed(body(idle_power_limit_pct=10), SECRET)).idle_power_limit_pct == 10
    assert parse(signed(body(idle_power_limit_pct=100), SECRET)).idle_power_limit_pct == 100


@pytest.mark.parametrize("pct", [9, 0, -40, 101, 1000, 40.0, "40", True, [40]])
def test_it_refuses_an_idle_power_cap_outside_the_protocols_range(pct):
    with pytest.raises(SnapshotRefused) as raised:
        parse(signed(body(idle_power_limit_pct=pct), SECRET))

    assert str(raised.value) == f"idle_power_limit_pct {pct!r}: must be a whole percent from 10 to 100, or null"
    assert raised.value.version == 3  # authentic: counted as seen, not pulled again


def test_the_idle_power_cap_is_covered_by_the_signature():
    raw = signed(body(idle_power_limit_pct=40), SECRET)

    assert refused({**raw, "idle_power_limit_pct": 10}) == "bad or missing signature"


@pytest.mark.parametrize("raw", [None, [], "snapshot", 7, [("node", NODE)]])
def test_it_refuses_what_is_not_an_object(raw):
    assert refused(raw) == "not a snapshot object"


def test_it_refuses_a_missing_signature():
    assert refused(body()) == "bad or missing signature"


@pytest.mark.parametrize("signature", [None, "", "00" * 32, 12345, ["x"]])
def test_it_refuses_a_bad_signature(signature):
    assert refused({**body(), "signature": signature}) == "bad or missing signature"


def test_it_refuses_a_snapshot_signed_with_another_secret():
    assert refused(signed(body(), "another secret")) == "bad or missing signature"


def test_it_refuses_an_empty_secret_even_for_a_snapshot_signed_with_it():
    with pytest.raises(SnapshotRefused, match="signature"):
        parse_snapshot(signed(body(), ""), node_name=NODE, secret="")


@pytest.mark.parametrize(
    "tamper",
    [
        lambda raw: raw.update(version=4),
        lambda raw: raw["leases"][0].update(user="mallory"),
        lambda raw: raw["leases"][0].update(end=(END + timedelta(days=30)).isoformat()),
        lambda raw: raw["leases"].append(lease(reservation=99, user="mallory")),
        lambda raw: raw.update(leases=[]),
        lambda raw: raw.update(extra=True),
    ],
)
def test_it_refuses_content_changed_after_signing(tamper):
    raw = signed(body(), SECRET)
    tamper(raw)

    assert refused(raw) == "bad or missing signature"


@pytest.mark.parametrize("node", ["gpu-h100", None, "GPU-A100", ""])
def test_it_refuses_a_snapshot_for_another_node(node):
    raw = signed(body(node=node), SECRET)

    assert refused(raw) == f"addressed to node {node!r}, this is 'gpu-a100'"


def test_it_refuses_a_snapshot_without_a_node():
    raw = signed({key: value for key, value in body().items() if key != "node"}, SECRET)

    assert refused(raw) == "addressed to node None, this is 'gpu-a100'"


@pytest.mark.parametrize("version", [0, -1, "3", True, None, 3.0, [3]])
def test_it_refuses_a_bad_version(version):
    assert refused(signed(body(version=version), SECRET)) == f"bad version {version!r}"


@pytest.mark.parametrize("issued_at", [None, 1715000000, "yesterday", "2030-05-06T09:00:00"])
def test_it_refuses_a_bad_issued_at(issued_at):
    assert refused(signed(body(issued_at=issued_at), SECRET)).startswith("issued_at: ")


@pytest.mark.parametrize("leases", [None, {"0": lease()}, "[]", lease()])
def test_it_refuses_leases_that_are_not_a_list(leases):
    assert refused(signed(body(leases=leases), SECRET)) == "leases must be a list"


@pytest.mark.parametrize("item", [None, "alice", [lease()], 7])
def test_it_refuses_a_lease_that_is_not_an_object(item):
    assert refused(signed(body(leases=[item]), SECRET)) == "lease 0: not an object"


@pytest.mark.parametrize("reservation", [None, "42", True, 4.2])
def test_it_refuses_a_bad_reservation_id(reservation):
    assert refused(signed(body(leases=[lease(reservation=reservation)]), SECRET)) == (
        f"lease 0: bad reservation id {reservation!r}"
    )


@pytest.mark.parametrize(
    "user",
    ["../etc", "a;rm -rf /", "alice\n", "bob,u:eve:rw", "", 7, None, "Alice", "-alice", "a" * 33],
)
def test_it_refuses_hostile_usernames(user):
    assert refused(signed(body(leases=[lease(user=user)]), SECRET)) == f"lease 0: refused username {user!r}"


@pytest.mark.parametrize(
    "gpus",
    [
        ["../../dev/sda"],
        ["GPU-"],
        ["gpu0"],
        [""],
        [],
        [[]],
        [GPU_0, "../../dev/sda"],
        [GPU_0 + "\n"],
        ["GPU-zzzzzzzz-zzzz"],
        [7],
        GPU_0,  # a string, not a list
        None,
        {GPU_0: True},
    ],
)
def test_it_refuses_hostile_gpu_ids(gpus):
    assert refused(signed(body(leases=[lease(gpus=gpus)]), SECRET)) == f"lease 0: refused GPU list {gpus!r}"


@pytest.mark.parametrize("field", ["start", "end"])
def test_it_refuses_naive_timestamps(field):
    naive = START.replace(tzinfo=None).isoformat()

    message = refused(signed(body(leases=[lease(**{field: naive})]), SECRET))

    assert message == f"lease 0 {field}: timestamp without a time zone"


@pytest.mark.parametrize("value", ["tomorrow", "2030-13-01T00:00:00+00:00", "", None, 1715000000, ["2030"]])
@pytest.mark.parametrize("field", ["start", "end"])
def test_it_refuses_garbage_timestamps(field, value):
    assert refused(signed(body(leases=[lease(**{field: value})]), SECRET)).startswith(f"lease 0 {field}: not ")


@pytest.mark.parametrize("end", [START, START - timedelta(seconds=1)])
def test_it_refuses_a_lease_that_ends_before_it_starts(end):
    raw = signed(body(leases=[lease(end=end.isoformat())]), SECRET)

    assert refused(raw) == "lease 0: ends before it starts"


def test_one_bad_lease_refuses_the_whole_snapshot():
    raw = signed(body(leases=[lease(), lease(reservation=43, user="bob"), lease(reservation=44, user="../x")]), SECRET)

    assert refused(raw) == "lease 2: refused username '../x'"


def test_a_system_account_is_well_formed_here_the_node_refuses_its_lease_alone():
    """Whether an account may have a GPU is the node's call (gpubook_agent/accounts.py), lease by
    lease: a signed snapshot naming root is parsed, and the enforcer refuses that one lease."""
    raw = signed(body(leases=[lease(), lease(reservation=44, user="root")]), SECRET)

    assert [item.user for item in parse_snapshot(raw, node_name=NODE, secret=SECRET).leases] == ["alice", "root"]


def test_a_lease_is_active_from_its_start_up_to_but_not_at_its_end():
    item = Lease(reservation=1, user="alice", gpus=(GPU_0,), start=START, end=END)
    tick = timedelta(microseconds=1)

    assert not item.active_at(START - tick)
    assert item.active_at(START)
    assert item.active_at(END - tick)
    assert not item.active_at(END)
    assert item.active_at(START.astimezone(timezone(timedelta(hours=-7))))  # the same instant elsewhere


# -- what arrives: JSON text, bounded before it is parsed ----------------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def refused_text(payload: Any) -> str:
    with pytest.raises(SnapshotRefused) as raised:
        decode_snapshot(payload)
    return str(raised.value)


def test_a_snapshot_as_json_text_is_parsed_then_checked_as_an_object():
    raw = signed(body(), SECRET)
    text = json.dumps(raw, separators=(",", ":"))

    assert decode_snapshot(text) == raw
    assert decode_snapshot(text.encode()) == raw
    assert parse(decode_snapshot(text)).version == 3


def test_the_object_older_portals_push_is_still_taken():
    raw = signed(body(), SECRET)

    assert decode_snapshot(raw) is raw


def test_ten_thousand_levels_of_nesting_are_refused_unparsed_not_a_recursion_error():
    assert refused_text(nested(10_000)) == f"nested deeper than {MAX_SNAPSHOT_DEPTH} levels: not read"
    assert refused_text(nested(10_000).encode()).startswith("nested deeper")
    signature_inside = '{"node":"gpu-a100","leases":' + nested(10_000) + ',"signature":"' + "0" * 64 + '"}'
    assert refused_text(signature_inside).startswith("nested deeper")


def test_nesting_deeper_than_the_limit_in_an_object_is_refused_too():
    deep: list[Any] = []
    for _ in range(MAX_SNAPSHOT_DEPTH):
        deep = [deep]

    assert refused_text({**body(), "leases": deep}).startswith("nested deeper")
    assert decode_snapshot({**body(), "leases": deep[0][0]})  # two levels less: within the limit


def test_the_depth_limit_lets_every_real_snapshot_through():
    """A real snapshot nests four deep however many leases it has; brackets in strings do not count."""
    leases = [lease(reservation=n, user=f"u{n}") for n in range(1, 2000)]
    text = json.dumps(signed(body(leases=leases), SECRET))
    assert json_depth(text) == 4
    assert json_depth('{"a": ["[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\\\\\\"", {"b": [[]]}]}') == 5
    assert json_depth(nested(MAX_SNAPSHOT_DEPTH + 1)) == MAX_SNAPSHOT_DEPTH + 1


def test_a_fifty_megabyte_body_is_refused_unparsed():
    huge = '{"node":"' + "x" * (50 * 1024 * 1024) + '"}'

    assert refused_text(huge) == f"larger than {MAX_SNAPSHOT_BYTES} bytes: not read"
    assert refused_text(huge.encode()) == f"larger than {MAX_SNAPSHOT_BYTES} bytes: not read"


@pytest.mark.parametrize("payload", ["", "{", "not json", '{"a": 1} trailing', b"\xff\xfe{}"])
def test_text_that_is_not_json_is_refused(payload):
    assert refused_text(payload).startswith(("not JSON", "not UTF-8"))


# -- authentic but refused: the version counts as seen --------------------------------------------


def test_a_refusal_of_an_authentic_snapshot_names_its_version():
    with pytest.raises(SnapshotRefused) as raised:
        parse(signed(body(leases=[lease(user="../x")]), SECRET))

    assert raised.value.version == 3


@pytest.mark.parametrize(
    "raw", [body(), signed(body(version=99), "another secret"), {**signed(body(), SECRET), "node": "x"}]
)
def test_a_refusal_of_a_forgery_names_no_version(raw):
    with pytest.raises(SnapshotRefused) as raised:
        parse(raw)

    assert raised.value.version is None


# -- freshness ------------------------------------------------------------------------------------

ISSUED = START - timedelta(days=1)
TICK = timedelta(microseconds=1)


def fresh_at(now: datetime) -> None:
    check_fresh(parse(signed(body(), SECRET)), now=now, max_age_seconds=600)


@pytest.mark.parametrize("now", [ISSUED, ISSUED + timedelta(seconds=600), ISSUED - timedelta(minutes=2)])
def test_a_snapshot_up_to_max_age_old_or_two_minutes_ahead_is_fresh(now):
    fresh_at(now)


def test_a_snapshot_older_than_max_age_is_refused_with_its_version():
    with pytest.raises(SnapshotRefused, match="more than MAX_SNAPSHOT_AGE_SECONDS") as raised:
        fresh_at(ISSUED + timedelta(seconds=600) + TICK)

    assert raised.value.version == 3  # authentic: counted as seen, never pulled again


def test_a_thirty_day_old_snapshot_is_refused():
    with pytest.raises(SnapshotRefused, match="delayed or replayed"):
        fresh_at(ISSUED + timedelta(days=30))


def test_a_snapshot_more_than_two_minutes_ahead_is_refused():
    with pytest.raises(SnapshotRefused, match="ahead of this node's clock"):
        fresh_at(ISSUED - timedelta(minutes=2) - TICK)
