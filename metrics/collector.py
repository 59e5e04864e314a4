"""The metrics, built from the database at each scrape by one custom collector (prometheus_client's
``Collector``) in a registry of its own, so nothing else a process registers (the default
registry's process and GC metrics) ends up in /metrics.

The GPU and node figures come from the status cards (``reservations.fleet.fleet_status``), so /metrics
says exactly what the status page says: the same online rule, the same GPU state, the same holder.
Six queries per scrape whatever the fleet's size: three for the cards, one for lease versions, one
for bookings, one for the periodic jobs' last successes (alerts/jobs.py).

Stale readings are not exported as current: a GPU's utilisation, memory, temperature, power, ECC
and process count appear only while its node is online and its reading is younger than
AGENT_OFFLINE_AFTER_SECONDS; the series then stop (Prometheus marks them stale, graphs show a gap).
``gpubook_gpu_reading_age_seconds`` stays, and says how old the last reading is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from alerts.jobs import JobState, job_states
from fairshare.factors import FairShare, fairshare_table
from metrics import selectors
from reservations.fleet import STATES, fleet_status
from waitlist.selectors import waitlist_counts

MIB = 1024 * 1024
GPU_LABELS = ["node", "gpu", "holder"]
NODE_LABELS = ["node"]

# (name, help, telemetry field, conversion) of the readings exported while fresh.
READINGS: list[tuple[str, str, str, Callable[[Any], float]]] = [
    (
        "gpubook_gpu_utilization_ratio",
        "GPU utilisation as the agent last read it from NVML, 0 to 1.",
        "utilization_pct",
        lambda pct: pct / 100,
    ),
    ("gpubook_gpu_memory_used_bytes", "GPU memory in use.", "memory_used_mib", lambda mib: mib * MIB),
    (
        "gpubook_gpu_memory_total_bytes",
        "GPU memory in all, as the driver reports it.",
        "memory_total_mib",
        lambda mib: mib * MIB,
    ),
    ("gpubook_gpu_temperature_celsius", "GPU temperature.", "temperature_c", float),
    (
        "gpubook_gpu_slowdown_temperature_celsius",
        "The temperature at which the GPU slows itself down.",
        "slowdown_temperature_c",
        float,
    ),
    ("gpubook_gpu_power_watts", "GPU power draw.", "power_w", float),
    (
        "gpubook_gpu_power_limit_watts",
        "GPU power limit now (lowered while the node's idle power cap holds the card).",
        "power_limit_w",
        float,
    ),
    (
        "gpubook_gpu_ecc_errors_uncorrected",
        "Uncorrected ECC errors the driver counts for the GPU (may fall back to 0 when the driver reloads).",
        "ecc_errors_uncorrected",
        float,
    ),
]


def _moment(iso: str | None) -> datetime | None:
    return datetime.fromisoformat(iso) if iso else None


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


class FleetCollector(Collector):
    """Every family is yielded at each scrape, samples or not, so the names and HELP lines are
    always there (an empty lab still shows what it would export)."""

    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        nodes = fleet_status(now=now)
        yield from self._gpus(nodes, now)
        yield from self._nodes(nodes, selectors.lease_versions(), now)
        yield from self._bookings(selectors.booking_counts(now=now), now)
        yield from self._jobs(job_states(now=now), now)
        yield from self._fair_share(fairshare_table(now=now))
        yield from self._waitlist(waitlist_counts())

    def _gpus(self, nodes: list[dict[str, Any]], now: datetime) -> Iterator[Metric]:
        fresh_for = timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS)
        info = _gauge(
            "gpubook_gpu_info",
            "One per GPU (physical GPUs; MIG slices: gpubook_mig_slice_held_gpus).",
            [*GPU_LABELS[:2], "uuid", "model"],
        )
        state = _gauge(
            "gpubook_gpu_state",
            f"1 for the GPU's state on the status page, 0 for the others ({', '.join(STATES)}).",
            [*GPU_LABELS, "state"],
        )
        age = _gauge("gpubook_gpu_reading_age_seconds", "Seconds since the GPU's last telemetry reading.", GPU_LABELS)
        processes = _gauge("gpubook_gpu_processes", "Processes using the GPU at its last reading.", GPU_LABELS)
        # No holder label: a counter's series must not change name with each booking.
        energy = CounterMetricFamily(
            "gpubook_gpu_energy_joules",
            "Energy the GPU used: its NVML counter (source=counter), or its power readings added up by the agent "
            "where the card has none (source=power). Starts again from 0 when the driver reloads (source=power: "
            "when the agent restarts), which rate() and increase() take as a counter reset.",
            labels=[*GPU_LABELS[:2], "source"],
        )
        readings = {name: _gauge(name, documentation, GPU_LABELS) for name, documentation, _, _ in READINGS}
        slices = _gauge(
            "gpubook_mig_slice_held_gpus",
            "One per MIG slice: its share of its card (compute slices over the card's) while someone holds it, else 0; "
            "summed, the GPUs held in slices.",
            [*GPU_LABELS[:2], "slice", "profile", "holder"],
        )
        drained = 0
        for node in nodes:
            for card in node["gpus"]:
                gpu = str(card["index"])
                holder = card["current"]["user"] if card["current"] else ""
                labels = [node["name"], gpu, holder or ""]
                info.add_metric([node["name"], gpu, card["uuid"], card["model"]], 1)
                for name in STATES:
                    state.add_metric([*labels, name], 1 if card["state"] == name else 0)
                drained += card["drained"]
                for piece in card.get("slices", ()):
                    held_by = piece["current"]["user"] if piece["current"] else ""
                    slice_labels = [node["name"], gpu, str(piece["placement"]), piece["profile"], held_by]
                    slices.add_metric(slice_labels, piece["share"] if held_by else 0)
                telemetry = card["telemetry"]
                at = _moment(telemetry["at"]) if telemetry else None
                if telemetry is None or at is None:
                    continue
                age.add_metric(labels, max((now - at).total_seconds(), 0))
                if not node["online"] or now - at >= fresh_for:
                    continue  # stale: not exported as if current
                for name, _, field, convert in READINGS:
                    if telemetry[field] is not None:
                        readings[name].add_metric(labels, convert(telemetry[field]))
                processes.add_metric(labels, len(telemetry["processes"]))
                if telemetry["energy_mj"] is not None:
                    source = "power" if telemetry["energy_estimated"] else "counter"
                    energy.add_metric([node["name"], gpu, source], telemetry["energy_mj"] / 1000)
        yield info
        yield state
        yield from readings.values()
        yield processes
        yield energy
        yield age
        yield slices
        yield GaugeMetricFamily(
            "gpubook_gpus_drained", "GPUs drained by their agent, waiting for an admin.", value=drained
        )

    def _nodes(self, nodes: list[dict[str, Any]], lease_versions: dict[str, int], now: datetime) -> Iterator[Metric]:
        up = _gauge(
            "gpubook_node_up", "1 while the node's agent reports (the status page's online), else 0.", NODE_LABELS
        )
        info = _gauge(
            "gpubook_node_info",
            "One per node: its status (active, maintenance, disabled) and what its agent last said.",
            [*NODE_LABELS, "hostname", "status", "agent_version", "backend", "driver_version"],
        )
        report_age = _gauge(
            "gpubook_agent_last_report_age_seconds", "Seconds since the node's agent last reported.", NODE_LABELS
        )
        lease_lag = _gauge(
            "gpubook_agent_lease_version_lag",
            "Lease snapshots the portal made for the node that its agent has not applied yet.",
            NODE_LABELS,
        )
        skew = _gauge(
            "gpubook_agent_clock_skew_seconds",
            "The agent's clock minus the portal's, at its last heartbeat.",
            NODE_LABELS,
        )
        dropped = CounterMetricFamily(
            "gpubook_agent_events_dropped",
            "Events the node's agent sent past NODE_EVENTS_PER_MINUTE: counted, not stored.",
            labels=NODE_LABELS,
        )
        for node in nodes:
            name, agent = node["name"], node["agent"] or {}
            up.add_metric([name], 1 if node["online"] else 0)
            info.add_metric(
                [
                    name,
                    node["hostname"],
                    node["status"],
                    agent.get("version") or "",
                    agent.get("backend") or "",
                    agent.get("driver_version") or "",
                ],
                1,
            )
            last_seen = _moment(node["last_seen"])
            if last_seen is not None:
                report_age.add_metric([name], max((now - last_seen).total_seconds(), 0))
            if node["agent"] is not None:
                lease_lag.add_metric([name], lease_versions.get(name, 0) - agent["applied_lease_version"])
            if agent.get("clock_skew_seconds") is not None:
                skew.add_metric([name], agent["clock_skew_seconds"])
            if node["agent"] is not None:
                dropped.add_metric([name], agent.get("events_dropped") or 0)
        yield from (up, info, report_age, lease_lag, skew, dropped)

    def _bookings(self, bookings: selectors.Bookings, now: datetime) -> Iterator[Metric]:
        live = _gauge(
            "gpubook_reservations",
            "Bookings running now or still to come, by status (pending, approved) and phase (running, upcoming).",
            ["status", "phase"],
        )
        for (status, phase), count in bookings.live.items():
            live.add_metric([status, phase], count)
        yield live
        yield GaugeMetricFamily(
            "gpubook_pending_approvals",
            "Bookings waiting for an admin's decision (not ended yet).",
            value=bookings.pending,
        )
        oldest = bookings.oldest_pending_created_at
        yield GaugeMetricFamily(
            "gpubook_pending_approval_oldest_age_seconds",
            "How long the oldest booking waiting for an admin has waited; 0 when none waits.",
            value=max((now - oldest).total_seconds(), 0) if oldest else 0,
        )

    def _jobs(self, jobs: list[JobState], now: datetime) -> Iterator[Metric]:
        labels = ["job", "task"]
        period = _gauge(
            "gpubook_periodic_job_period_seconds", "How often beat runs the job (portal/celery.py).", labels
        )
        age = _gauge(
            "gpubook_periodic_job_last_success_age_seconds",
            "Seconds since a run of the job that beat started last succeeded (absent until one has).",
            labels,
        )
        late = _gauge(
            "gpubook_periodic_job_late",
            "1 while the job is more than three periods (and two minutes) late: the portal's jobs_late alert.",
            labels,
        )
        for job in jobs:
            job_labels = [job.name, job.task]
            period.add_metric(job_labels, job.period.total_seconds())
            since = job.age(now)
            if since is not None:
                age.add_metric(job_labels, since.total_seconds())
            late.add_metric(job_labels, 1 if job.is_late(now) else 0)
        yield from (period, age, late)

    def _fair_share(self, table: list[FairShare]) -> Iterator[Metric]:
        factor = _gauge(
            "gpubook_fairshare_factor", "Each active person's fair-share factor, 2^(-usage/share).", ["user"]
        )
        usage = _gauge("gpubook_fairshare_usage", "Each person's decayed usage over everyone's (0..1).", ["user"])
        share = _gauge("gpubook_fairshare_share", "Each person's share of the GPUs (0..1).", ["user"])
        for row in table:
            factor.add_metric([row.username], row.factor)
            usage.add_metric([row.username], row.usage)
            share.add_metric([row.username], row.share)
        yield from (factor, usage, share)

    def _waitlist(self, counts: dict[str, int]) -> Iterator[Metric]:
        entries = _gauge(
            "gpubook_waitlist_entries", "Open waitlist entries: waiting, or offered a slot to claim.", ["state"]
        )
        for state, count in sorted(counts.items()):
            entries.add_metric([state], count)
        yield entries


REGISTRY = CollectorRegistry()
REGISTRY.register(FleetCollector())


def render() -> bytes:
    """The metrics as Prometheus' text format (0.0.4), read from the database now."""
    return generate_latest(REGISTRY)
