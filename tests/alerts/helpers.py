"""Reports as an agent sends them, for the alert tests."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.utils import timezone

from nodes.ingest import agent_events_record, telemetry_record


def reading(gpu, **values: Any) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "utilization_pct": 50,
        "memory_used_mib": 1024,
        "memory_total_mib": 81920,
        "temperature_c": 60,
        "slowdown_temperature_c": 95,
        "power_w": 200.0,
        "ecc_errors_uncorrected": 0,
        "processes": [],
        **values,
    }


def report(node, gpu, when: datetime | None = None, **values: Any) -> None:
    telemetry_record(node=node, samples=[reading(gpu, **values)], now=when or timezone.now())


def event(node, kind: str, gpu=None, user: str = "", **fields: Any) -> None:
    body = {"kind": kind, "at": timezone.now(), "gpu": gpu.uuid if gpu else "", "user": user, **fields}
    agent_events_record(node=node, events=[body])
