"""What /metrics says about a known lab (tests/metrics/conftest.py: ``lab``)."""

from __future__ import annotations

import pytest

from nodes.models import Gpu
from reservations.fleet import STATES
from tests.conftest import at
from tests.factories import book, carve_mig
from tests.metrics.conftest import names, value

MIB = 1024 * 1024
pytestmark = pytest.mark.usefixtures("lab")


def test_a_held_gpu_has_its_readings_labelled_with_node_gpu_and_holder(scrape):
    text = scrape()
    gpu0 = {"node": "gpu-a100", "gpu": "0", "holder": "alice"}
    assert value(text, "gpubook_gpu_utilization_ratio", **gpu0) == 0.81
    assert value(text, "gpubook_gpu_memory_used_bytes", **gpu0) == 1024 * MIB
    assert value(text, "gpubook_gpu_memory_total_bytes", **gpu0) == 81920 * MIB
    assert value(text, "gpubook_gpu_temperature_celsius", **gpu0) == 70
    assert value(text, "gpubook_gpu_slowdown_temperature_celsius", **gpu0) == 90
    assert value(text, "gpubook_gpu_power_watts", **gpu0) == 300.5
    assert value(text, "gpubook_gpu_ecc_errors_uncorrected", **gpu0) == 0
    assert value(text, "gpubook_gpu_processes", **gpu0) == 1
    assert value(text, "gpubook_gpu_reading_age_seconds", **gpu0) == 5
    assert value(text, "gpubook_gpu_state", **gpu0, state="in_use") == 1
    assert value(text, "gpubook_gpu_state", **gpu0, state="free") == 0


def test_energy_is_a_counter_in_joules_labelled_by_its_source_and_not_by_holder(scrape):
    text = scrape()
    assert value(text, "gpubook_gpu_energy_joules_total", node="gpu-a100", gpu="0", source="counter") == 7_200_000.123
    assert value(text, "gpubook_gpu_energy_joules_total", node="gpu-a100", gpu="1", source="power") == 55
    assert "# TYPE gpubook_gpu_energy_joules_total counter" in text
    # A GPU without an energy reading, and a stale one, export none.
    assert value(text, "gpubook_gpu_energy_joules_total", node="gpu-a100", gpu="2", source="counter") is None
    assert value(text, "gpubook_gpu_energy_joules_total", node="gpu-a100", gpu="2", source="power") is None


def test_a_free_gpu_has_an_empty_holder_and_no_reading_the_card_does_not_report(scrape):
    text = scrape()
    gpu1 = {"node": "gpu-a100", "gpu": "1", "holder": ""}
    assert value(text, "gpubook_gpu_utilization_ratio", **gpu1) == 0
    assert value(text, "gpubook_gpu_power_watts", **gpu1) is None  # not reported by the card
    assert value(text, "gpubook_gpu_state", **gpu1, state="drained") == 1
    assert value(text, "gpubook_gpus_drained") == 1


def test_every_gpu_has_its_info_and_one_state(scrape, lab):
    text = scrape()
    gpus = [("gpu-a100", str(i)) for i in range(4)] + [("gpu-v100", str(i)) for i in range(2)]
    uuid = lab["a100"].gpus.get(index=3).uuid
    assert value(text, "gpubook_gpu_info", node="gpu-a100", gpu="3", uuid=uuid, model="NVIDIA A100-SXM4-80GB") == 1
    for node, gpu in gpus:
        holder = {("gpu-a100", "0"): "alice", ("gpu-v100", "0"): "bob"}.get((node, gpu), "")
        states = [value(text, "gpubook_gpu_state", node=node, gpu=gpu, holder=holder, state=s) for s in STATES]
        assert sorted(states) == [0] * (len(STATES) - 1) + [1], (node, gpu, states)


def test_stale_readings_are_not_exported_as_current(scrape):
    text = scrape()
    # gpu-a100 is online, but GPU 2's last reading is 2 minutes old: its age only.
    gpu2 = {"node": "gpu-a100", "gpu": "2", "holder": ""}
    assert value(text, "gpubook_gpu_utilization_ratio", **gpu2) is None
    assert value(text, "gpubook_gpu_reading_age_seconds", **gpu2) == 120
    # gpu-v100 is offline: no readings at all, though bob's pending booking holds GPU 0.
    gpu0 = {"node": "gpu-v100", "gpu": "0", "holder": "bob"}
    for name in ("gpubook_gpu_utilization_ratio", "gpubook_gpu_temperature_celsius", "gpubook_gpu_processes"):
        assert value(text, name, **gpu0) is None
    assert value(text, "gpubook_gpu_reading_age_seconds", **gpu0) == 600
    assert value(text, "gpubook_gpu_state", **gpu0, state="offline") == 1
    # A GPU never read has no age either.
    assert value(text, "gpubook_gpu_reading_age_seconds", node="gpu-a100", gpu="3", holder="") is None


def test_nodes_say_whether_their_agent_is_up_and_how_far_behind_it_is(scrape):
    text = scrape()
    assert value(text, "gpubook_node_up", node="gpu-a100") == 1
    assert value(text, "gpubook_node_up", node="gpu-v100") == 0
    assert value(text, "gpubook_agent_last_report_age_seconds", node="gpu-a100") == 5
    assert value(text, "gpubook_agent_last_report_age_seconds", node="gpu-v100") == 600
    assert value(text, "gpubook_agent_lease_version_lag", node="gpu-a100") == 2
    assert value(text, "gpubook_agent_clock_skew_seconds", node="gpu-a100") == 0.25
    assert value(text, "gpubook_agent_clock_skew_seconds", node="gpu-v100") is None  # never measured
    info = {"hostname": "gpu-a100.lab.example", "status": "active", "agent_version": "0.3.0", "backend": "nvml"}
    assert value(text, "gpubook_node_info", node="gpu-a100", driver_version="550.54", **info) == 1


def test_bookings_are_counted_by_status_and_phase(scrape):
    text = scrape()
    assert value(text, "gpubook_reservations", status="approved", phase="running") == 1
    assert value(text, "gpubook_reservations", status="approved", phase="upcoming") == 1
    assert value(text, "gpubook_reservations", status="pending", phase="running") == 1
    assert value(text, "gpubook_reservations", status="pending", phase="upcoming") == 1
    assert value(text, "gpubook_pending_approvals") == 2
    # Both pending bookings were made at 09:00; it is 10:30.
    assert value(text, "gpubook_pending_approval_oldest_age_seconds") == 90 * 60


def test_ended_bookings_and_a_node_back_online_change_the_figures(scrape, clock, lab):
    from django.utils import timezone

    from nodes.models import AgentState

    clock.move_to(at(3.5), tick=False)  # alice's 10:00-11:00 and bob's 10:00-12:00 have ended
    AgentState.objects.filter(node=lab["v100"]).update(last_seen=timezone.now())
    text = scrape()
    assert value(text, "gpubook_node_up", node="gpu-v100") == 1
    assert value(text, "gpubook_reservations", status="approved", phase="running") == 1  # alice, 12:00-13:00
    assert value(text, "gpubook_reservations", status="pending", phase="running") == 0
    assert value(text, "gpubook_pending_approvals") == 1
    assert value(text, "gpubook_gpu_state", node="gpu-a100", gpu="1", holder="alice", state="offline") == 1


def test_every_name_has_the_prefix_and_nothing_else_is_exported(scrape):
    exported = names(scrape())
    assert all(name.startswith("gpubook_") for name in exported), exported  # no process_* or python_*
    assert {"gpubook_gpu_utilization_ratio", "gpubook_node_up", "gpubook_pending_approvals"} <= exported


def test_each_periodic_job_has_its_period_its_last_success_age_and_whether_it_is_late(scrape, clock):
    from datetime import timedelta

    from django.utils import timezone

    from alerts.jobs import job_states, job_succeeded
    from portal.celery import app

    now = timezone.now()
    job_states(now=now - timedelta(hours=2), watch_new=True)  # watched for two hours
    job_succeeded(name="push-all-leases", task="nodes.push_all_leases", now=now - timedelta(seconds=42))
    job_succeeded(name="prune-usage", task="nodes.prune_usage", now=now - timedelta(minutes=100))
    text = scrape()

    leases = {"job": "push-all-leases", "task": "nodes.push_all_leases"}
    assert value(text, "gpubook_periodic_job_period_seconds", **leases) == 60
    assert value(text, "gpubook_periodic_job_last_success_age_seconds", **leases) == 42
    assert value(text, "gpubook_periodic_job_late", **leases) == 0
    prune = {"job": "prune-usage", "task": "nodes.prune_usage"}
    assert value(text, "gpubook_periodic_job_last_success_age_seconds", **prune) == 6000
    assert value(text, "gpubook_periodic_job_late", **prune) == 0  # hourly: late after three hours
    # Never succeeded, watched for two hours: no age, and late (every minute).
    mail = {"job": "send-due-mail", "task": "notifications.send_due"}
    assert value(text, "gpubook_periodic_job_last_success_age_seconds", **mail) is None
    assert value(text, "gpubook_periodic_job_late", **mail) == 1
    # Every entry of the schedule is there.
    for name, entry in app.conf.beat_schedule.items():
        assert value(text, "gpubook_periodic_job_late", job=name, task=entry["task"]) is not None, name


def test_a_held_mig_slice_counts_its_share_of_the_card(scrape, alice):
    pieces = carve_mig(Gpu.objects.get(node__name="gpu-a100", index=3))  # the lab's GPU 3: never read, free
    book(alice, [pieces[0]], at(1), at(2), direct=True)  # the lab's clock is at 10:30
    text = scrape()
    slice_of = {"node": "gpu-a100", "gpu": "3"}
    held = value(text, "gpubook_mig_slice_held_gpus", **slice_of, slice="0", profile="3g.40gb", holder="alice")
    free = value(text, "gpubook_mig_slice_held_gpus", **slice_of, slice="4", profile="2g.20gb", holder="")
    assert (round(held, 4), free) == (round(3 / 7, 4), 0)
