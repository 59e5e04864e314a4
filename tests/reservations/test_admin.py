"""Django admin: the lab's people book, approve, reject and cancel through the same services."""

from __future__ import annotations

import pytest
from django.urls import reverse

from audit.models import AuditEntry
from reservations.models import Limit, MaintenanceWindow, Reservation
from reservations.services import reservation_create
from tests.conftest import at
from tests.factories import book

pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def admin_client(client, carol):
    client.force_login(carol)
    return client


@pytest.fixture
def pending_pair(alice, bob, gpus, node):
    node.requires_approval = True
    node.save()
    return [
        book(alice, gpus[:1], at(1), at(2)),
        book(bob, gpus[1:2], at(1), at(2)),
    ]


def test_researchers_cannot_open_admin(client, alice):
    client.force_login(alice)
    response = client.get(reverse("admin:reservations_reservation_changelist"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_the_changelist_lists_pending_first(admin_client, alice, carol, gpus, pending_pair):
    approved = reservation_create(user=alice, gpus=gpus[2:3], start=at(5), end=at(6), actor=carol)
    response = admin_client.get(reverse("admin:reservations_reservation_changelist"))
    assert response.status_code == 200
    ids = [r.pk for r in response.context["cl"].result_list]
    assert ids.index(pending_pair[0].pk) < ids.index(approved.pk)
    assert ids.index(pending_pair[1].pk) < ids.index(approved.pk)


@pytest.mark.parametrize(
    "page",
    [
        "admin:nodes_node_changelist",
        "admin:nodes_gpu_changelist",
        "admin:reservations_limit_changelist",
        "admin:reservations_maintenancewindow_changelist",
        "admin:audit_auditentry_changelist",
        "admin:reservations_reservation_add",
        "admin:reservations_limit_add",
        "admin:nodes_node_add",
    ],
)
def test_admin_pages_open(admin_client, pending_pair, page):
    assert admin_client.get(reverse(page)).status_code == 200


def test_bulk_approve_goes_through_the_service(admin_client, pending_pair, carol):
    response = admin_client.post(
        reverse("admin:reservations_reservation_changelist"),
        {"action": "approve_selected", "_selected_action": [r.pk for r in pending_pair]},
        follow=True,
    )
    assert "Approved 2 reservations." in response.content.decode()
    assert set(Reservation.objects.values_list("status", "decided_by")) == {("approved", carol.pk)}
    assert AuditEntry.objects.filter(action="reservation.approve").count() == 2


def test_bulk_reject_asks_for_a_reason_first(admin_client, pending_pair):
    url = reverse("admin:reservations_reservation_changelist")
    selected = {"action": "reject_selected", "_selected_action": [r.pk for r in pending_pair]}

    asked = admin_client.post(url, selected)
    assert "reason" in asked.content.decode()
    assert not Reservation.objects.filter(status="rejected").exists()

    admin_client.post(url, {**selected, "apply": "1", "reason": "cluster reserved for the course"}, follow=True)
    assert set(Reservation.objects.values_list("status", "decision_reason")) == {
        ("rejected", "cluster reserved for the course")
    }


def test_a_failed_action_says_why_and_keeps_the_rest(admin_client, pending_pair, carol):
    from reservations.services import reservation_approve

    reservation_approve(reservation=pending_pair[0], actor=carol)
    response = admin_client.post(
        reverse("admin:reservations_reservation_changelist"),
        {"action": "approve_selected", "_selected_action": [r.pk for r in pending_pair]},
        follow=True,
    )
    text = response.content.decode()
    assert "Approved 1 reservation." in text
    assert f"#{pending_pair[0].pk}: Reservation #{pending_pair[0].pk} is approved and cannot be approved." in text


def test_adding_a_booking_in_admin_uses_the_booking_rules(admin_client, alice, bob, gpus):
    reservation_create(user=bob, gpus=gpus[:1], start=at(1), end=at(3))
    url = reverse("admin:reservations_reservation_add")
    form = {
        "user": alice.pk,
        "gpus": [gpus[0].pk, gpus[1].pk],
        "purpose": "demo",
        "start_0": "2030-01-07",
        "start_1": "11:00:00",
        "end_0": "2030-01-07",
        "end_1": "12:00:00",
    }

    refused = admin_client.post(url, form)
    assert refused.status_code == 200
    assert "Slot taken: gpu-a100/GPU 0 is booked 2030-01-07 10:00–12:00 UTC by bob" in refused.content.decode()
    assert Reservation.objects.count() == 1

    form["gpus"] = [gpus[2].pk, gpus[3].pk]
    created = admin_client.post(url, form)
    assert created.status_code == 302
    reservation = Reservation.objects.get(user=alice)
    assert reservation.created_by.username == "carol"
    assert sorted(reservation.allocations.values_list("gpu__index", flat=True)) == [2, 3]


def test_reservations_cannot_be_deleted_or_edited_in_admin(admin_client, pending_pair):
    reservation = pending_pair[0]
    change_url = reverse("admin:reservations_reservation_change", args=[reservation.pk])
    admin_client.post(change_url, {"purpose": "edited"})
    reservation.refresh_from_db()
    assert reservation.purpose == ""
    assert admin_client.get(reverse("admin:reservations_reservation_delete", args=[reservation.pk])).status_code == 403


def test_limit_edits_are_audited(admin_client):
    admin_client.post(
        reverse("admin:reservations_limit_add"),
        {"scope": "site", "max_gpus_at_once": "4", "weekly_gpu_hours": "40"},
    )
    limit = Limit.objects.get()
    entry = AuditEntry.objects.get(action="limit.create")
    assert entry.after["max_gpus_at_once"] == 4
    assert entry.target_id == str(limit.pk)


def test_a_maintenance_window_over_bookings_warns_the_admin(admin_client, alice, gpus, node):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(3))
    response = admin_client.post(
        reverse("admin:reservations_maintenancewindow_add"),
        {
            "node": node.pk,
            "start_0": "2030-01-07",
            "start_1": "11:00:00",
            "end_0": "2030-01-07",
            "end_1": "13:00:00",
            "reason": "PSU",
        },
        follow=True,
    )
    assert MaintenanceWindow.objects.count() == 1
    assert f"1 booking(s) overlap this window and were kept: #{reservation.pk} (alice)" in response.content.decode()


def test_a_maintenance_window_for_a_gpu_of_another_node_is_refused(admin_client, node):
    from tests.factories import node_with_gpus

    other_gpu = node_with_gpus(1, name="gpu-4090").gpus.get()
    response = admin_client.post(
        reverse("admin:reservations_maintenancewindow_add"),
        {
            "node": node.pk,
            "gpu": other_gpu.pk,
            "start_0": "2030-01-07",
            "start_1": "11:00:00",
            "end_0": "2030-01-07",
            "end_1": "10:00:00",
        },
    )
    assert response.status_code == 200
    assert not MaintenanceWindow.objects.exists()
    text = response.content.decode()
    assert "The end must be after the start." in text
