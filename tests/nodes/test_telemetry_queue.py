"""Telemetry queued by the web process and stored in batches by the ingest process (nodes/telemetry_queue.py):
the same results as storing each report at once, nothing lost or counted twice when the consumer dies,
each GPU's readings in order, a burst of 1,000 nodes absorbed, and a refusal when the queue is full."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import redis
from django.db import connection
from django.db.models import Sum

from alerts.models import Alert, AlertStreak
from kernel.redis_client import redis_client
from nodes import telemetry_queue
from nodes.history import forget_all, history_of
from nodes.ingest import telemetry_record
from nodes.liveness import nodes_mark_offline
from nodes.models import AgentState, Gpu, GpuMinute, GpuTelemetry, IngestMark, Node
from nodes.telemetry_queue import STREAM, MarkMoved, telemetry_backlog, telemetry_consume, telemetry_enqueue
from tests.factories import node_with_gpus
from tests.live.server import INGEST, ROOT, ingest_environment, start_ingest
from tests.nodes.test_agent_reports import TELEMETRY, agent_client, sample
from tests.race import at_once

START = datetime(2030, 1, 7, 9, 0, 5, tzinfo=UTC)


@pytest.fixture(autouse=True)
def empty_stream():
    redis_client().delete(STREAM)
    forget_all()  # the test database reuses GPU ids: no sparkline of an earlier test
    yield
    redis_client().delete(STREAM)


@pytest.fixture
def other_node(db):
    return node_with_gpus(2, name="gpu-4090")


@pytest.fixture
def queued(settings):
    settings.TELEMETRY_INGEST = "queue"


def body(samples: list[dict]) -> dict:
    return {"sent_at": START.isoformat(), "gpus": samples}


def scenario(node: Node) -> list[tuple[datetime, list[dict]]]:
    """Three minutes of a two-GPU node every 20 s (three reports a minute): utilisation moving, GPU 1
    reporting none at times and no memory or temperature for a whole minute and for one report, GPU 0
    running hot for four reports (an alert opens) and cooling down (it resolves), a user's processes
    coming and going; GPU 0's energy counter growing 100 W until it starts again (a driver reload) at the
    seventh report, GPU 1's an estimated one (its power added up by the agent)."""
    gpu0, gpu1 = Gpu.objects.filter(node=node).order_by("index")
    reports = []
    for step in range(9):
        hot = 3 <= step <= 6
        reports.append(
            (
                START + timedelta(seconds=20 * step),
                [
                    sample(
                        gpu0.uuid,
                        utilization_pct=10 * step,
                        temperature_c=90 if hot else 60 + step,
                        energy_mj=1_000_000 + 2_000_000 * step if step <= 5 else 500_000 * (step - 5),
                    ),
                    sample(
                        gpu1.uuid,
                        utilization_pct=None if step % 3 == 0 else 100 - step,
                        memory_used_mib=None if step in (3, 4, 5, 7) else 1000 * step,
                        temperature_c=None if step in (0, 1, 2, 8) else 61,
                        processes=[] if step % 2 else [{"pid": 7, "user": "alice", "used_memory_mib": 100}],
                        energy_mj=10_000 * step,
                        energy_estimated=True,
                    ),
                ],
            )
        )
    return reports


def outcome(node: Node) -> dict:
    """What a user or admin sees of a node's telemetry, by GPU index rather than id."""
    index = dict(Gpu.objects.filter(node=node).values_list("pk", "index"))
    minutes = sorted(
        (
            index[m.gpu_id],
            m.minute,
            m.samples,
            m.utilization_samples,
            m.utilization_sum,
            m.memory_used_max_mib,
            m.temperature_max_c,
            m.energy_mj,
            m.energy_estimated,
        )
        for m in GpuMinute.objects.filter(gpu__node=node)
    )
    latest = sorted(
        (index[t.gpu_id], t.at, t.utilization_pct, t.temperature_c, t.memory_used_mib, t.processes)
        for t in GpuTelemetry.objects.filter(gpu__node=node)
    )
    alerts = sorted(
        (a.kind, index[a.gpu_id], a.opened_at, a.last_bad_at, a.resolved_at, a.resolution, a.details)
        for a in Alert.objects.filter(node=node)
    )
    streaks = sorted((s.kind, index[s.gpu_id], s.count) for s in AlertStreak.objects.filter(node=node))
    return {
        "minutes": minutes,
        "latest": latest,
        "alerts": alerts,
        "streaks": streaks,
        "last_seen": AgentState.objects.get(node=node).last_seen,
        "history": [points for _, points in sorted(history_of(list(index)).items())],
    }


def with_agent_state(node: Node) -> Node:
    AgentState.objects.create(node=node, last_seen=START - timedelta(seconds=5))
    return node


def test_a_batch_stores_what_each_report_stored_at_once_would(db, django_capture_on_commit_callbacks):
    inline = with_agent_state(node_with_gpus(2, name="gpu-inline"))
    batched = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    with django_capture_on_commit_callbacks(execute=True):
        for now, samples in scenario(inline):
            telemetry_record(node=inline, samples=samples, now=now)
        for now, samples in scenario(batched):
            telemetry_enqueue(node=batched, samples=samples, now=now)

        assert telemetry_backlog() == 9
        assert GpuMinute.objects.filter(gpu__node=batched).count() == 0  # queued, not stored
        assert telemetry_consume() == 9  # all of them, in one transaction
        assert telemetry_backlog() == 0

    expected, got = outcome(inline), outcome(batched)
    assert got == expected
    minute = START.replace(second=0)
    # (GPU, minute, samples, with utilisation, utilisation sum, peak memory, peak temperature, energy, estimated):
    # NULL where a whole minute had none, the others' peak where one reading had none. Energy: each 20 s
    # interval's split by the time it spent in each minute (09:00:45-09:01:05: 15 s and 5 s); GPU 0's reset
    # at 09:02:05 counts the 500 J since, spread over 09:01:45-09:02:05 and marks both minutes estimated.
    assert got["minutes"] == [
        (0, minute, 3, 3, 30, 2048, 62, 5_500_000, False),
        (0, minute + timedelta(minutes=1), 3, 3, 120, 2048, 90, 4_875_000, True),
        (0, minute + timedelta(minutes=2), 3, 3, 210, 2048, 90, 1_125_000, True),
        (1, minute, 3, 2, 197, 2000, None, 27_500, True),
        (1, minute + timedelta(minutes=1), 3, 2, 191, None, 61, 30_000, True),
        (1, minute + timedelta(minutes=2), 3, 2, 185, 8000, 61, 22_500, True),
    ]
    assert [value for _, value in got["history"][1]] == [99, 98, 96, 95, 93, 92]
    # The scenario did what it says: an alert opened and resolved, minutes with and without utilisation.
    assert [(kind, resolved is not None) for kind, _, _, _, resolved, _, _ in got["alerts"]] == [("temperature", True)]
    assert {row[0] for row in got["minutes"]} == {0, 1}
    assert got["latest"][0][2] == 80
    assert got["last_seen"] == START + timedelta(seconds=160)


def test_the_endpoint_queues_the_node_s_own_gpus_and_names_the_others(db, node, gpus, other_node, queued):
    client = agent_client(node)
    foreign = Gpu.objects.filter(node=other_node).first()
    response = client.post(
        TELEMETRY, body([sample(gpus[0].uuid), sample(foreign.uuid), sample("GPU-made-up")]), format="json"
    )

    assert response.status_code == 200, response.json()
    assert response.json() == {"stored": 1, "ignored_gpus": sorted([foreign.uuid, "GPU-made-up"])}
    assert not GpuTelemetry.objects.exists()  # the ingest process stores it
    assert telemetry_consume() == 1
    assert list(GpuTelemetry.objects.values_list("gpu_id", "utilization_pct")) == [(gpus[0].pk, 87)]
    assert not GpuTelemetry.objects.filter(gpu=foreign).exists()


def test_a_full_queue_refuses_the_report_with_a_reason_and_keeps_nothing_of_it(db, node, gpus, queued, settings):
    settings.TELEMETRY_QUEUE_MAX = 2
    client = agent_client(node)
    for _ in range(2):
        assert client.post(TELEMETRY, body([sample(gpus[0].uuid)]), format="json").status_code == 200

    refused = client.post(TELEMETRY, body([sample(gpus[0].uuid, utilization_pct=1)]), format="json")

    assert refused.status_code == 503
    assert refused["Retry-After"] == "5"
    assert refused.json()["error"]["code"] == "telemetry_backlog"
    assert "behind on storing telemetry" in refused.json()["error"]["message"]
    assert telemetry_consume() == 2
    assert GpuTelemetry.objects.get(gpu=gpus[0]).utilization_pct == 87  # not the refused 1
    assert client.post(TELEMETRY, body([sample(gpus[0].uuid)]), format="json").status_code == 200


def test_a_queue_past_its_size_refuses_the_report_too(db, node, gpus, queued, settings):
    settings.TELEMETRY_QUEUE_MAX_MB = 0.0001  # about 100 bytes: less than any stream holding one report
    client = agent_client(node)
    assert client.post(TELEMETRY, body([sample(gpus[0].uuid)]), format="json").status_code == 200  # empty before

    refused = client.post(TELEMETRY, body([sample(gpus[0].uuid, utilization_pct=1)]), format="json")

    assert refused.status_code == 503
    assert refused.json()["error"]["code"] == "telemetry_backlog"
    assert redis_client().xlen(STREAM) == 1
    assert telemetry_consume() == 1
    assert GpuTelemetry.objects.get(gpu=gpus[0]).utilization_pct == 87


@pytest.fixture
def queued_scenario(db):
    """The scenario's nine reports of a node, queued."""
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    for now, samples in scenario(node):
        telemetry_enqueue(node=node, samples=samples, now=now)
    return node


def test_a_batch_that_fails_before_its_commit_stores_nothing_and_is_stored_once_later(
    queued_scenario, monkeypatch, django_capture_on_commit_callbacks
):
    def die(*args, **kwargs):
        raise RuntimeError("the consumer died after writing, before committing")

    with monkeypatch.context() as patched:
        patched.setattr(IngestMark.objects, "filter", die)  # the mark's move, the batch's last write
        with pytest.raises(RuntimeError):
            telemetry_consume()
    assert not GpuMinute.objects.exists()
    assert not AlertStreak.objects.exists() and not Alert.objects.exists()

    with django_capture_on_commit_callbacks(execute=True):
        assert telemetry_consume() == 9
    assert GpuMinute.objects.aggregate(samples=Sum("samples"))["samples"] == 18
    assert Alert.objects.count() == 1
    gpu0 = Gpu.objects.get(node=queued_scenario, index=0)
    assert len(history_of([gpu0.pk])[gpu0.pk]) == 9  # the failed try added no sparkline point


def test_a_consumer_that_dies_between_its_commit_and_the_trim_does_not_store_the_batch_again(
    queued_scenario, monkeypatch
):
    def die(*args, **kwargs):
        raise ConnectionError("the consumer died after its commit")

    with monkeypatch.context() as patched:
        patched.setattr(type(redis_client()), "xtrim", die)
        with pytest.raises(ConnectionError):
            telemetry_consume()
    assert redis_client().xlen(STREAM) == 9  # still in the stream, but behind the mark

    assert telemetry_consume() == 0
    assert GpuMinute.objects.aggregate(samples=Sum("samples"))["samples"] == 18
    assert Alert.objects.count() == 1
    assert telemetry_backlog() == 0
    assert redis_client().xlen(STREAM) == 0  # trimmed at last


def test_each_gpu_s_readings_are_stored_in_the_order_they_came(db, django_capture_on_commit_callbacks):
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    gpu0, gpu1 = Gpu.objects.filter(node=node).order_by("index")
    for step in range(30):
        now = START + timedelta(seconds=step)
        telemetry_enqueue(
            node=node,
            samples=[sample(gpu0.uuid, utilization_pct=step), sample(gpu1.uuid, utilization_pct=99 - step)],
            now=now,
        )

    with django_capture_on_commit_callbacks(execute=True):
        assert telemetry_consume(limit=7) == 7  # in batches of 7: 7, 7, 7, 7, 2
        while telemetry_consume(limit=7):
            pass

    assert GpuTelemetry.objects.get(gpu=gpu0).utilization_pct == 29  # the last one, not any
    assert GpuTelemetry.objects.get(gpu=gpu1).utilization_pct == 70
    history = history_of([gpu0.pk, gpu1.pk])
    assert [value for _, value in history[gpu0.pk]] == list(range(30))
    assert [value for _, value in history[gpu1.pk]] == [99 - step for step in range(30)]
    assert AgentState.objects.get(node=node).last_seen == START + timedelta(seconds=29)


def test_a_burst_from_a_thousand_nodes_is_absorbed(db):
    names = [f"burst-{n:04d}" for n in range(1000)]
    Node.objects.bulk_create(Node(name=name, hostname=f"{name}.lab") for name in names)
    nodes = list(Node.objects.filter(name__in=names))
    Gpu.objects.bulk_create(
        Gpu(node=node, index=i, uuid=f"GPU-{node.name}-{i}", model="NVIDIA H100", memory_mib=81559)
        for node in nodes
        for i in range(8)
    )
    for node in nodes:
        telemetry_enqueue(
            node=node, samples=[sample(f"GPU-{node.name}-{i}", utilization_pct=i) for i in range(8)], now=START
        )

    assert telemetry_backlog() == 1000
    while telemetry_consume():
        pass

    assert telemetry_backlog() == 0
    assert GpuTelemetry.objects.filter(gpu__node__name__startswith="burst-").count() == 8000
    totals = GpuMinute.objects.filter(gpu__node__name__startswith="burst-").aggregate(
        samples=Sum("samples"), utilization=Sum("utilization_sum")
    )
    assert totals == {"samples": 8000, "utilization": 1000 * sum(range(8))}


def test_two_consumers_at_once_store_each_report_once(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip("two connections at once: PostgreSQL")
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    gpu0, gpu1 = Gpu.objects.filter(node=node).order_by("index")
    for step in range(400):
        telemetry_enqueue(
            node=node, samples=[sample(gpu0.uuid), sample(gpu1.uuid)], now=START + timedelta(seconds=step)
        )

    def consume() -> str:
        while telemetry_consume(limit=10):
            pass
        return "drained"

    outcomes = at_once([consume] * 3, refusals={MarkMoved: "overtaken"})

    assert outcomes == {"drained": 3}, outcomes  # each waited on the others' lock, none was overtaken
    assert GpuMinute.objects.aggregate(samples=Sum("samples"))["samples"] == 800
    assert telemetry_backlog() == 0


def test_the_ingest_process_killed_mid_stream_loses_nothing_and_counts_nothing_twice(transactional_db):
    """The real consume_telemetry process, on a queue of 3,000 reports in batches of 25, killed with
    SIGKILL while it works; a second one stores the rest."""
    if connection.vendor != "postgresql":
        pytest.skip("the ingest process shares the test database: PostgreSQL only")
    node = with_agent_state(node_with_gpus(8, name="gpu-batched"))
    uuids = list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", flat=True))
    reports = 3000
    for step in range(reports):
        samples = [sample(uuid, utilization_pct=step % 101) for uuid in uuids]
        telemetry_enqueue(node=node, samples=samples, now=START + timedelta(seconds=step))
    first = start_ingest(TELEMETRY_BATCH_REPORTS="25")
    try:
        deadline = time.monotonic() + 60
        while telemetry_backlog() > reports * 2 // 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(10)
    left = telemetry_backlog()
    assert 0 < left < reports, f"the process was killed with {left} reports left"

    env = ingest_environment(TELEMETRY_BATCH_REPORTS="25")
    subprocess.run([*INGEST, "--once"], cwd=ROOT, env=env, check=True, capture_output=True, timeout=120)  # noqa: S603

    assert telemetry_backlog() == 0
    totals = GpuMinute.objects.aggregate(samples=Sum("samples"), utilization=Sum("utilization_sum"))
    assert totals == {"samples": reports * 8, "utilization": 8 * sum(step % 101 for step in range(reports))}
    assert GpuTelemetry.objects.get(gpu__uuid=uuids[0]).utilization_pct == (reports - 1) % 101


def test_a_report_that_waited_while_its_node_went_offline_does_not_bring_it_back(db):
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    gpu0 = Gpu.objects.filter(node=node).order_by("index").first()
    telemetry_enqueue(node=node, samples=[sample(gpu0.uuid)], now=START)  # queued, then the agent dies
    AgentState.objects.filter(node=node).update(last_seen=START + timedelta(seconds=4))  # its last heartbeat
    nodes_mark_offline(START + timedelta(minutes=5))
    offline = Alert.objects.get(node=node, kind=Alert.Kind.OFFLINE)

    assert telemetry_consume() == 1

    state = AgentState.objects.get(node=node)
    assert state.offline_since == START + timedelta(minutes=5)
    assert state.last_seen == START + timedelta(seconds=4)
    offline.refresh_from_db()
    assert offline.resolved_at is None
    assert GpuTelemetry.objects.get(gpu=gpu0).at == START  # the reading itself is kept


def test_a_report_queued_before_its_node_was_marked_offline_leaves_it_offline(db):
    """Its last telemetry is newer than its last heartbeat, but older than the offline mark."""
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    gpu0 = Gpu.objects.filter(node=node).order_by("index").first()
    telemetry_enqueue(node=node, samples=[sample(gpu0.uuid)], now=START)  # then the agent dies
    nodes_mark_offline(START + timedelta(seconds=45))

    assert telemetry_consume() == 1

    assert AgentState.objects.get(node=node).offline_since == START + timedelta(seconds=45)
    assert Alert.objects.get(node=node, kind=Alert.Kind.OFFLINE).resolved_at is None


def test_a_report_the_database_refuses_is_passed_over_and_the_others_are_stored(db, caplog):
    if connection.vendor != "postgresql":
        pytest.skip("SQLite stores an integer of any size")
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    gpu0, gpu1 = Gpu.objects.filter(node=node).order_by("index")
    telemetry_enqueue(node=node, samples=[sample(gpu0.uuid, utilization_pct=1)], now=START)
    # Past the column's range: validation refuses it (below), a report queued some other way still must not block.
    telemetry_enqueue(node=node, samples=[sample(gpu1.uuid, memory_used_mib=2**31)], now=START + timedelta(seconds=5))
    telemetry_enqueue(node=node, samples=[sample(gpu0.uuid, utilization_pct=3)], now=START + timedelta(seconds=10))

    assert telemetry_consume() == 3
    assert telemetry_backlog() == 0
    assert GpuTelemetry.objects.get(gpu=gpu0).utilization_pct == 3
    assert not GpuTelemetry.objects.filter(gpu=gpu1).exists()
    assert GpuMinute.objects.get(gpu=gpu0).samples == 2
    assert "passed over" in caplog.text


def test_a_value_past_the_database_s_range_is_refused_when_it_is_posted(db, node, gpus, queued):
    refused = agent_client(node).post(TELEMETRY, body([sample(gpus[0].uuid, memory_used_mib=2**31)]), format="json")
    assert refused.status_code == 400
    assert "memory_used_mib" in refused.json()["error"]["message"]


def test_with_redis_away_the_web_process_stores_the_report_itself(db, node, gpus, queued, monkeypatch):
    away = redis.Redis(host="127.0.0.1", port=9, socket_connect_timeout=0.5)  # nothing listens there
    monkeypatch.setattr(telemetry_queue, "redis_client", lambda: away)
    monkeypatch.setattr(telemetry_queue, "_paused_until", 0.0)

    answers = [agent_client(node).post(TELEMETRY, body([sample(gpus[0].uuid)]), format="json") for _ in range(2)]

    assert [answer.status_code for answer in answers] == [200, 200]
    # Both stored (in one minute's row, or two when the clock passed a minute between the reports).
    assert sum(GpuMinute.objects.filter(gpu=gpus[0]).values_list("samples", flat=True)) == 2
    assert telemetry_queue._paused_until > time.monotonic()  # the second did not wait on Redis again


@pytest.fixture
def redis_without_scripts():
    """A client of a Redis user with every right but scripting (EVAL, EVALSHA, SCRIPT)."""
    user, password = f"gpubook-test-noscript-{uuid.uuid4().hex[:12]}", uuid.uuid4().hex  # (suites run side by side)
    admin = redis_client()
    admin.execute_command("ACL", "SETUSER", user, "reset", "on", f">{password}", "~*", "&*", "+@all", "-@scripting")
    pool = admin.connection_pool  # the same server and database, as that user
    kwargs = {**pool.connection_kwargs, "username": user, "password": password}
    client = redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))
    yield client
    client.close()
    admin.execute_command("ACL", "DELUSER", user)


def test_a_redis_user_that_may_not_run_scripts_is_named_and_the_report_stored_all_the_same(
    db, node, gpus, queued, monkeypatch, redis_without_scripts, caplog
):
    monkeypatch.setattr(telemetry_queue, "redis_client", lambda: redis_without_scripts)
    monkeypatch.setattr(telemetry_queue, "_paused_until", 0.0)

    answer = agent_client(node).post(TELEMETRY, body([sample(gpus[0].uuid, utilization_pct=42)]), format="json")

    assert answer.status_code == 200, answer.json()
    assert GpuTelemetry.objects.get(gpu=gpus[0]).utilization_pct == 42  # stored by the web process
    assert "may not run EVALSHA and EVAL" in caplog.text
    assert "Redis is away" not in caplog.text


def test_a_stream_made_again_behind_the_mark_is_read_from_its_start(db):
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    gpu0 = Gpu.objects.filter(node=node).order_by("index").first()
    ahead = f"{int(time.time() * 1000) + 3_600_000}-0"  # a mark made by a clock an hour ahead
    IngestMark.objects.create(stream=STREAM, last_id=ahead)
    telemetry_enqueue(node=node, samples=[sample(gpu0.uuid)], now=START)

    assert telemetry_backlog() == 1  # not trimmed away
    assert telemetry_consume() == 0  # found behind the mark: read again from its start
    assert telemetry_consume() == 1
    assert GpuTelemetry.objects.filter(gpu=gpu0).exists()


def test_a_refused_report_alone_in_its_batch_and_an_unreadable_entry_are_passed_over(db, caplog):
    node = with_agent_state(node_with_gpus(2, name="gpu-batched"))
    gpu0, gpu1 = Gpu.objects.filter(node=node).order_by("index")
    redis_client().xadd(STREAM, {"something": "else"})  # no report in it
    if connection.vendor == "postgresql":  # SQLite stores an integer of any size
        telemetry_enqueue(node=node, samples=[sample(gpu1.uuid, memory_used_mib=2**31)], now=START)
    telemetry_enqueue(node=node, samples=[sample(gpu0.uuid)], now=START + timedelta(seconds=5))

    while telemetry_consume(limit=1):  # each alone in its batch
        pass

    assert telemetry_backlog() == 0
    assert GpuTelemetry.objects.get(gpu=gpu0).utilization_pct == 87
    assert "cannot be read: passed over" in caplog.text
