"""MIG layouts from the agents' heartbeats (issue 18): slices become GPU rows under their card, bookable
only once an admin confirms the layout; vanished slices leave booking; a node reports only its own."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.sites import site
from django.contrib.messages.storage.fallback import FallbackStorage
from django.test import RequestFactory
from django.utils import timezone

from alerts.models import Alert
from audit.models import AuditEntry
from gpubook_agent import protocol
from nodes.admin import GpuAdmin
from nodes.mig import CardLayout, mig_layout_confirm
from nodes.models import Gpu
from notifications.services import outbox_drain
from tests.factories import node_with_gpus
from tests.nodes.test_agent_reports import HEARTBEAT, agent_client, heartbeat


def slice_(n: int, profile: str, start: int, size: int, compute: int) -> protocol.MigSlice:
    return protocol.mig_slice(
        uuid=f"MIG-{n:08x}-1111-2222-3333-444444444444",
        profile=profile,
        gpu_instance_id=n + 1,
        compute_instance_id=0,
        placement_start=start,
        placement_size=size,
        compute_slices=compute,
        memory_mib=size * 10240,
    )


A = slice_(1, "3g.40gb", 0, 4, 3)
B = slice_(2, "2g.20gb", 4, 2, 2)
C = slice_(3, "2g.20gb", 6, 2, 2)


def layout(card: Gpu, *slices: protocol.MigSlice, current: bool = True, pending: bool = True) -> protocol.MigCard:
    return protocol.mig_card(
        uuid=card.uuid, mode_current=current, mode_pending=pending, placement_slots=8, compute_slices=7, slices=slices
    )


@pytest.fixture
def report(node):
    client = agent_client(node)

    def send(*cards: protocol.MigCard) -> dict:
        response = client.post(HEARTBEAT, heartbeat(mig=list(cards)), format="json")
        assert response.status_code == 200, response.json()
        return response.json()

    return send


def test_a_reported_layout_makes_slices_that_wait_for_an_admin(report, gpus, carol):
    report(layout(gpus[0], A, B, C))
    card = Gpu.objects.get(pk=gpus[0].pk)
    slices = list(card.slices.order_by("placement_start"))
    # MIG going on is a change of the card too (issue 36): it waits for the admin, out of booking meanwhile.
    assert not card.mig_mode and CardLayout.waiting(card) == CardLayout(True, 7, 8) and not card.is_bookable
    assert [(s.profile, s.placement_start, s.placement_size, s.bookable) for s in slices] == [
        ("3g.40gb", 0, 4, False),
        ("2g.20gb", 4, 2, False),
        ("2g.20gb", 6, 2, False),
    ]
    assert {s.node_id for s in slices} == {card.node_id} and {s.index for s in slices} == {card.index}

    confirmed = mig_layout_confirm(card=card, actor=carol)
    assert [s.uuid for s in confirmed] == [A["uuid"], B["uuid"], C["uuid"]]
    assert all(s.bookable for s in card.slices.all())
    card.refresh_from_db()
    assert card.mig_mode and (card.compute_slices, card.memory_slices) == (7, 8) and card.is_bookable
    assert AuditEntry.objects.filter(action="gpu.mig_layout_confirm").exists()


def test_the_same_layout_again_writes_nothing_and_a_change_waits_for_the_admin_again(report, gpus, carol):
    report(layout(gpus[0], A, B, C))
    mig_layout_confirm(card=Gpu.objects.get(pk=gpus[0].pk), actor=carol)
    before = list(Gpu.objects.order_by("pk").values())
    report(layout(gpus[0], A, B, C))
    assert list(Gpu.objects.order_by("pk").values()) == before

    report(layout(gpus[0], A, B))  # C destroyed on the node
    gone = Gpu.objects.get(uuid=C["uuid"])
    assert gone.gone_at is not None and not gone.bookable
    assert Gpu.objects.get(uuid=A["uuid"]).bookable  # the others as they were

    report(layout(gpus[0], A, B, C))  # back: a layout to confirm again
    back = Gpu.objects.get(uuid=C["uuid"])
    assert back.gone_at is None and not back.bookable


def test_a_pending_mode_change_takes_the_card_out_of_mig_mode(report, gpus):
    report(layout(gpus[0], A, current=True, pending=False))
    assert not Gpu.objects.get(pk=gpus[0].pk).mig_mode
    with pytest.raises(ValueError, match="not in MIG mode"):
        mig_layout_confirm(card=Gpu.objects.get(pk=gpus[0].pk), actor=None)


def test_a_node_cannot_report_slices_for_another_nodes_card_or_take_its_slices(report, gpus, db):
    other = node_with_gpus(1, name="gpu-4090")
    foreign_card = other.gpus.get()
    report(layout(foreign_card, A))
    assert not Gpu.objects.filter(uuid=A["uuid"]).exists()

    Gpu.objects.create(
        node=other, parent=foreign_card, index=0, uuid=B["uuid"], model="x", memory_mib=1, profile="2g.20gb"
    )
    report(layout(gpus[0], B))
    assert Gpu.objects.get(uuid=B["uuid"]).parent == foreign_card


@pytest.mark.parametrize(
    ("slices", "words"),
    [
        ((A, slice_(9, "3g.40gb", 2, 4, 3)), "overlaps another GPU instance"),
        ((slice_(9, "1g.10gb", 7, 2, 1),), "does not fit its card"),
        ((A, A), "appears twice"),
    ],
)
def test_an_impossible_layout_is_refused_whole(node, gpus, slices, words):
    response = agent_client(node).post(HEARTBEAT, heartbeat(mig=[layout(gpus[0], *slices)]), format="json")
    assert response.status_code == 400
    assert words in str(response.json())
    assert not Gpu.objects.filter(parent__isnull=False).exists()


def admin_post(user, data: dict | None = None):
    request = RequestFactory().post("/admin/nodes/gpu/", data or {})
    request.user = user
    request.session = {}
    request._messages = FallbackStorage(request)
    return request


def test_the_admin_action_shows_the_layout_then_confirms_what_was_shown_and_says_why_not(report, gpus, carol):
    report(layout(gpus[0], A, B))
    chosen = Gpu.objects.filter(pk__in=[gpus[0].pk, gpus[1].pk])
    page = GpuAdmin(Gpu, site).confirm_mig_layout(admin_post(carol), chosen)
    page.render()
    assert "MIG off" in page.content.decode() and "MIG on, 7 compute and 8 memory slices" in page.content.decode()
    seen = {f"seen-{shown['card'].pk}": shown["seen"] for shown in page.context_data["cards"]}
    assert not Gpu.objects.get(pk=gpus[0].pk).mig_mode  # looking confirms nothing

    request = admin_post(carol, {"apply": "1", **seen})
    assert GpuAdmin(Gpu, site).confirm_mig_layout(request, chosen) is None
    said = [str(message) for message in request._messages]
    assert any(
        "MIG off → MIG on, 7 compute and 8 memory slices confirmed; 2 slice(s) bookable (3g.40gb, 2g.20gb)" in line
        for line in said
    )
    assert any("not in MIG mode" in line for line in said)
    assert all(s.bookable for s in Gpu.objects.get(pk=gpus[0].pk).slices.all())


def test_a_layout_reported_after_the_admin_looked_is_not_confirmed_unseen(report, gpus, carol):
    report(layout(gpus[0], A, B))
    chosen = Gpu.objects.filter(pk=gpus[0].pk)
    page = GpuAdmin(Gpu, site).confirm_mig_layout(admin_post(carol), chosen)
    seen = {f"seen-{shown['card'].pk}": shown["seen"] for shown in page.context_data["cards"]}
    report(layout(gpus[0], A, B, C))  # a new slice while the admin reads the page

    request = admin_post(carol, {"apply": "1", **seen})
    GpuAdmin(Gpu, site).confirm_mig_layout(request, chosen)
    assert [str(message) for message in request._messages] == [
        "gpu-a100/GPU 0: its agent reported another layout since you looked. Look again."
    ]
    card = Gpu.objects.get(pk=gpus[0].pk)
    assert not card.mig_mode and not any(s.bookable for s in card.slices.all())


def test_a_booked_slice_that_vanishes_is_flagged_and_its_holder_mailed_once(
    report, gpus, alice, carol, booked, smtp_server
):
    report(layout(gpus[0], A, B, C))
    card = Gpu.objects.get(pk=gpus[0].pk)
    mig_layout_confirm(card=card, actor=carol)
    gone = Gpu.objects.get(uuid=C["uuid"])
    soon = timezone.now() + timedelta(days=1)
    reservation = booked(alice, [gone], soon, soon + timedelta(hours=2))

    report(layout(gpus[0], A, B))  # C destroyed on the node
    report(layout(gpus[0], A, B))  # and reported gone again: nothing new
    flagged = Alert.objects.get(kind=Alert.Kind.SLICE_GONE)
    assert (flagged.reservation_id, flagged.gpu_id, flagged.user) == (reservation.pk, gone.pk, alice)
    outbox_drain()
    to_alice = [m for m in smtp_server.messages if m["To"] == alice.email]
    assert [m["Subject"] for m in to_alice] == [f"The MIG slice of your booking #{reservation.pk} on gpu-a100 is gone"]
    assert "GPU 0 · 2g.20gb" in to_alice[0].get_body(("plain",)).get_content()
