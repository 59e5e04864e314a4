"""A known lab for /metrics, and reading its answer back with prometheus_client's own parser."""

from __future__ import annotations

import shutil
import subprocess
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from nodes.models import AgentState, GpuTelemetry, Node
from nodes.services import gpu_drain
from tests.conftest import at
from tests.factories import book, node_with_gpus

TOKEN = "metrics-token-for-the-tests-0123456789"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is missing: apt-get install prometheus (scripts/services does)"
)


def promtool(*args: str, input: str | None = None) -> str:
    """Run Prometheus' promtool; asserts it succeeds and returns what it printed."""
    assert PROMTOOL is not None
    done = subprocess.run(  # noqa: S603 - promtool from PATH, our own arguments
        [PROMTOOL, *args], input=input, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape: (name, labels) -> value."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


def names(text: str) -> set[str]:
    return {family.name for family in text_string_to_metric_families(text)}


@pytest.fixture
def scrape(settings):
    """GET /metrics with the right token; returns the body as text (asserting a 200)."""
    settings.METRICS_TOKEN, settings.METRICS_ALLOWED_IPS = TOKEN, []
    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    def get() -> str:
        response = client.get("/metrics")
        assert response.status_code == 200, response.content
        return response.content.decode()

    return get


def reading(gpu, *, age: timedelta, **values) -> GpuTelemetry:
    defaults = {"utilization_pct": 50, "memory_used_mib": 2048, "memory_total_mib": 81920, "temperature_c": 60}
    return GpuTelemetry.objects.create(gpu=gpu, at=timezone.now() - age, **(defaults | values))


@pytest.fixture
def lab(clock, alice, bob, carol):
    """At 10:30 on the test Monday:

    - gpu-a100 (4 GPUs, online, its agent 5 s ago, lease version 5 of which it applied 3, clock 0.25 s
      ahead): GPU 0 held by alice since 10:00 (approved, until 11:00), fresh reading with 1 process and
      its energy counter; GPU 1 drained, fresh reading, energy estimated from power; GPU 2 a reading 2
      minutes old (stale); GPU 3 never read. alice has another approved booking on GPU 1 at 12:00
      (upcoming).
    - gpu-v100 (2 GPUs, needs approval, offline: silent for 10 minutes, its reading as old): bob's
      pending booking of GPU 0 from 10:00 to 12:00 (running), and another at 14:00 (upcoming).
    """
    a100 = node_with_gpus(4, name="gpu-a100")
    v100 = node_with_gpus(2, name="gpu-v100", requires_approval=True)
    a, v = list(a100.gpus.order_by("index")), list(v100.gpus.order_by("index"))
    book(alice, [a[0]], at(1), at(2))
    book(alice, [a[1]], at(3), at(4))
    book(bob, [v[0]], at(1), at(3))
    book(bob, [v[1]], at(5), at(6))
    clock.move_to(at(1.5), tick=False)

    Node.objects.filter(pk=a100.pk).update(lease_version=5)
    now = timezone.now()
    AgentState.objects.create(
        node=a100, last_seen=now - timedelta(seconds=5), agent_version="0.3.0", backend="nvml",
        driver_version="550.54", applied_version=3, clock_skew_seconds=0.25,
    )  # fmt: skip
    AgentState.objects.create(node=v100, last_seen=now - timedelta(minutes=10), applied_version=2)
    reading(a[0], age=timedelta(seconds=5), utilization_pct=81, memory_used_mib=1024, temperature_c=70,
            slowdown_temperature_c=90, power_w=300.5, ecc_errors_uncorrected=0, energy_mj=7_200_000_123,
            energy_estimated=False, processes=[{"pid": 4242, "user": "alice", "used_memory_mib": 1000}])  # fmt: skip
    reading(a[1], age=timedelta(seconds=5), utilization_pct=0, energy_mj=55_000, energy_estimated=True)
    reading(a[2], age=timedelta(minutes=2), utilization_pct=99)
    reading(v[0], age=timedelta(minutes=10), utilization_pct=77)
    gpu_drain(gpu=a[1], reason="processes of bob could not be ended (pids 7)")
    return {"a100": a100, "v100": v100}
