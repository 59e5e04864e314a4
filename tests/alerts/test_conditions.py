"""What opens an alert and what resolves it: telemetry (two bad readings open, one good resolves),
agent events (open at once), nodes going offline and coming back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from alerts.models import Alert, AlertStreak
from alerts.records import Subject, alert_open
from live.status import refresh_status
from nodes.ingest import agent_heartbeat_record
from nodes.models import AgentState, NodeEvent
from nodes.services import gpu_return_to_service
from tests.alerts.helpers import event, report

pytestmark = pytest.mark.usefixtures("clock")


def open_alerts(kind):
    return list(Alert.objects.filter(kind=kind, resolved_at__isnull=True))


def test_a_hot_gpu_opens_an_alert_on_the_second_hot_reading_not_the_first(node, gpus):
    report(node, gpus[1], temperature_c=88)
    assert open_alerts("temperature") == []

    report(node, gpus[1], temperature_c=90)
    (alert,) = open_alerts("temperature")
    assert (alert.node, alert.gpu, alert.username) == (node, gpus[1], "")
    assert [r["temperature_c"] for r in alert.details["readings"]] == [88, 90]
    assert alert.details["limit_c"] == settings.ALERT_TEMPERATURE_C

    report(node, gpus[1], temperature_c=91)  # still hot: the same alert, no second one
    assert Alert.objects.filter(kind="temperature").count() == 1


def test_it_resolves_on_the_first_good_reading_and_forgets_the_streak(node, gpus, clock):
    report(node, gpus[0], temperature_c=86)
    report(node, gpus[0], temperature_c=87)
    clock.shift(timedelta(seconds=5))
    report(node, gpus[0], temperature_c=70)

    alert = Alert.objects.get(kind="temperature")
    assert alert.resolved_at == timezone.now()
    assert alert.resolution == "temperature back under the limit"
    assert not AlertStreak.objects.exists()


def test_one_hot_reading_between_good_ones_opens_nothing(node, gpus):
    for temperature in (90, 60, 90, 60, 90):
        report(node, gpus[0], temperature_c=temperature)
    assert not Alert.objects.exists()


def test_the_cards_own_slowdown_threshold_counts_when_it_is_lower(node, gpus):
    report(node, gpus[2], temperature_c=80, slowdown_temperature_c=79)
    report(node, gpus[2], temperature_c=80, slowdown_temperature_c=79)
    assert len(open_alerts("temperature")) == 1

    report(node, gpus[3], temperature_c=84, slowdown_temperature_c=None)  # under 85, no threshold known
    report(node, gpus[3], temperature_c=84, slowdown_temperature_c=None)
    assert len(open_alerts("temperature")) == 1


def test_a_missing_temperature_neither_opens_nor_resolves(node, gpus):
    report(node, gpus[0], temperature_c=90)
    report(node, gpus[0], temperature_c=90)
    report(node, gpus[0], temperature_c=None)
    assert len(open_alerts("temperature")) == 1


def test_uncorrected_ecc_errors_open_and_a_reset_counter_resolves(node, gpus):
    report(node, gpus[0], ecc_errors_uncorrected=2)
    report(node, gpus[0], ecc_errors_uncorrected=3)
    (alert,) = open_alerts("ecc")
    assert alert.details["readings"][-1]["ecc_errors_uncorrected"] == 3

    report(node, gpus[0], ecc_errors_uncorrected=0)
    assert open_alerts("ecc") == []


def test_a_healthy_report_writes_nothing(node, gpus, django_assert_max_num_queries):
    report(node, gpus[0])  # AgentState etc. as a real report leaves them
    with django_assert_max_num_queries(20):
        report(node, gpus[0])
    assert not AlertStreak.objects.exists()


def test_two_evaluations_cannot_open_the_same_alert_twice(node, gpus):
    subject = Subject("temperature", node.pk, gpus[0].pk)
    assert alert_open(subject=subject, now=timezone.now(), details={}) is not None
    assert alert_open(subject=subject, now=timezone.now(), details={}) is None
    # The wall under it: the partial unique constraint, also for an alert without a GPU.
    Alert.objects.create(kind="offline", node=node, opened_at=timezone.now(), last_bad_at=timezone.now())
    with pytest.raises(IntegrityError), transaction.atomic():
        Alert.objects.create(kind="offline", node=node, opened_at=timezone.now(), last_bad_at=timezone.now())


def test_a_node_marked_offline_opens_an_alert_and_its_next_report_resolves_it(node, gpus, clock):
    agent_heartbeat_record(node=node, data=heartbeat_data(), now=timezone.now())
    clock.shift(timedelta(seconds=settings.AGENT_OFFLINE_AFTER_SECONDS + 1))
    refresh_status()
    (alert,) = open_alerts("offline")
    assert (alert.node, alert.gpu) == (node, None)
    refresh_status()  # marked once: no second alert
    assert Alert.objects.filter(kind="offline").count() == 1

    clock.shift(timedelta(seconds=30))
    agent_heartbeat_record(node=node, data=heartbeat_data(), now=timezone.now())
    alert.refresh_from_db()
    assert alert.resolved_at == timezone.now() and alert.resolution == "the node reported again"
    assert AgentState.objects.get(node=node).offline_since is None


def test_telemetry_after_an_outage_resolves_the_offline_alert_too(node, gpus, clock):
    agent_heartbeat_record(node=node, data=heartbeat_data(), now=timezone.now())
    clock.shift(timedelta(minutes=5))
    refresh_status()
    report(node, gpus[0])
    assert open_alerts("offline") == []


def test_a_violation_opens_an_alert_at_once_and_clears_when_its_processes_are_gone(node, gpus):
    event(node, NodeEvent.Kind.VIOLATION, gpus[2], "mallory", pid=4242, message="no booking")
    (alert,) = open_alerts("violation")
    assert (alert.gpu, alert.username, alert.details["event"]["pid"]) == (gpus[2], "mallory", 4242)

    event(node, NodeEvent.Kind.VIOLATION, gpus[2], "mallory", pid=4243)  # another process: same alert
    assert Alert.objects.filter(kind="violation").count() == 1

    report(node, gpus[2], processes=[{"pid": 4242, "user": "mallory", "used_memory_mib": 10}])
    assert len(open_alerts("violation")) == 1
    report(node, gpus[2], processes=[{"pid": 99, "user": "alice", "used_memory_mib": 10}])
    assert open_alerts("violation") == []


def test_violations_of_two_users_are_two_alerts(node, gpus, alice):
    event(node, NodeEvent.Kind.VIOLATION, gpus[0], "mallory")
    event(node, NodeEvent.Kind.VIOLATION, gpus[0], "alice")
    alerts = {a.username: a for a in open_alerts("violation")}
    assert set(alerts) == {"mallory", "alice"}
    assert alerts["alice"].user == alice and alerts["mallory"].user is None


def test_leftovers_open_and_ended_resolves_them(node, gpus):
    event(node, NodeEvent.Kind.LEFTOVER, gpus[1], "bob", pids=[7, 8])
    (alert,) = open_alerts("leftover")
    assert alert.username == "bob"
    event(node, NodeEvent.Kind.ENDED, gpus[1], "bob", pids=[7, 8])
    assert open_alerts("leftover") == []
    assert not AlertStreak.objects.exists()


def test_an_unkillable_process_opens_an_alert_that_returning_the_gpu_resolves(node, gpus, carol):
    event(node, NodeEvent.Kind.UNKILLABLE, gpus[3], "bob", pids=[66])
    (alert,) = open_alerts("unkillable")
    gpus[3].refresh_from_db()
    assert gpus[3].drained_at is not None

    report(node, gpus[3], processes=[])  # telemetry does not clear it: a person must look
    assert len(open_alerts("unkillable")) == 1

    gpu_return_to_service(gpu=gpus[3], actor=carol)
    alert.refresh_from_db()
    assert alert.resolution == "returned to service" and alert.resolved_by == carol


def test_a_gpu_emptied_after_all_resolves_its_unkillable_alert(node, gpus):
    event(node, NodeEvent.Kind.UNKILLABLE, gpus[0], "bob", pids=[66])
    event(node, NodeEvent.Kind.DRAIN_CLEARED, gpus[0], "bob")
    assert open_alerts("unkillable") == []


def heartbeat_data():
    return {
        "sent_at": timezone.now(),
        "agent_version": "0.1.0",
        "backend": "simulated",
        "applied_version": 1,
        "acls": {},
        "drained": [],
    }
