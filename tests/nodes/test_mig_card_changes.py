"""Card-level MIG changes from a heartbeat (issue 36): a card's compute or memory slices, or its MIG mode, as
its agent reports them count for nothing until an admin confirms. Meanwhile limits count by the confirmed
numbers, the card and its slices take no bookings, and an alert is open; the confirmation applies them."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest
from django.contrib.admin.sites import site
from django.urls import reverse

from alerts.models import Alert
from alerts.selectors import alert_summary
from gpubook_agent import protocol
from nodes.admin import GpuAdmin
from nodes.mig import CardLayout, mig_layout_confirm
from nodes.models import Gpu
from reservations.fleet import fleet_status
from reservations.models import Limit
from reservations.selectors import held_periods
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import book
from tests.nodes.test_agent_reports import HEARTBEAT, agent_client, heartbeat
from tests.nodes.test_mig_layout import A, B, C, admin_post, slice_

RESERVATIONS = "/api/v1/reservations/"


def mig_card(
    card: Gpu, *slices: protocol.MigSlice, compute: int = 7, memory: int = 8, current: bool = True, pending: bool = True
) -> protocol.MigCard:
    return protocol.mig_card(
        uuid=card.uuid,
        mode_current=current,
        mode_pending=pending,
        placement_slots=memory,
        compute_slices=compute,
        slices=slices,
    )


@pytest.fixture
def report(node):
    client = agent_client(node)

    def send(*cards: protocol.MigCard) -> None:
        response = client.post(HEARTBEAT, heartbeat(mig=list(cards)), format="json")
        assert response.status_code == 200, response.json()

    return send


@pytest.fixture
def card(clock, report, gpus, carol) -> Gpu:
    """GPU 0 in MIG mode, 7 compute and 8 memory slices, split into A (3g), B and C (2g each), confirmed."""
    report(mig_card(gpus[0], A, B, C))
    mig_layout_confirm(card=gpus[0], actor=carol)
    return Gpu.objects.get(pk=gpus[0].pk)


def piece(slice_: protocol.MigSlice) -> Gpu:
    return Gpu.objects.get(uuid=slice_["uuid"])


def confirm_in_admin(card: Gpu, admin) -> list[str]:
    """The admin's two steps: the page that shows the layout, then "confirm" on it. Returns what admin said."""
    chosen = Gpu.objects.filter(pk=card.pk)
    page = GpuAdmin(Gpu, site).confirm_mig_layout(admin_post(admin), chosen)
    seen = {f"seen-{shown['card'].pk}": shown["seen"] for shown in page.context_data["cards"]}
    request = admin_post(admin, {"apply": "1", **seen})
    GpuAdmin(Gpu, site).confirm_mig_layout(request, chosen)
    return [str(message) for message in request._messages]


def api_book(user, gpus: list[Gpu], start_hour: float, end_hour: float):
    body = {"gpus": [gpu.pk for gpu in gpus], "start": at(start_hour).isoformat(), "end": at(end_hour).isoformat()}
    return client_for(user).post(RESERVATIONS, body, format="json")


def weekly_refusal(user, gpus) -> str:
    """What ``user`` is told asking 2 more GPU-hours: the weekly limit's message, with the hours used."""
    refused = api_book(user, gpus, 30, 32)
    assert refused.status_code == 403, refused.content
    return refused.json()["error"]["message"]


def open_layout_alerts() -> list[Alert]:
    return list(Alert.objects.filter(kind=Alert.Kind.MIG_LAYOUT_CHANGED, resolved_at__isnull=True))


def test_other_compute_slices_count_for_nothing_until_an_admin_confirms_them(card, report, gpus, alice, bob, carol):
    Limit.objects.create(scope=Limit.Scope.USER, user=alice, weekly_gpu_hours=Decimal(4))
    book(alice, [piece(A)], at(1), at(8))  # a 3g of a 7-slice card for 7 hours: 3 GPU-hours
    assert weekly_refusal(alice, [gpus[1]]).startswith("weekly GPU-hours: 3 used + 2 asked > 4 allowed")

    report(mig_card(gpus[0], A, B, C, compute=3))  # the card "has 3 compute slices": A would count 3/3
    card.refresh_from_db()
    assert card.compute_slices == 7 and CardLayout.waiting(card) == CardLayout(True, 3, 8)
    assert [period.gpus for period in held_periods(user=alice, start=at(0), end=at(24))] == [Fraction(3, 7)]
    assert weekly_refusal(alice, [gpus[1]]).startswith("weekly GPU-hours: 3 used + 2 asked > 4 allowed")
    assert not any(s.bookable for s in card.slices.all())
    refused = api_book(alice, [piece(B)], 10, 11)
    assert refused.status_code == 400
    assert refused.json()["error"]["message"] == (
        "gpu-a100/GPU 0 slice 2g.20gb@4 cannot be booked right now. "
        "The MIG layout of gpu-a100/GPU 0 changed on its node and waits for an admin."
    )
    assert api_book(alice, [card], 10, 11).status_code == 400  # the card is its slices: they wait
    [alert] = open_layout_alerts()
    assert (alert.node_id, alert.gpu_id) == (card.node_id, card.pk)
    assert alert_summary(alert).startswith(
        "confirmed: MIG on, 7 compute and 8 memory slices; its agent reports MIG on, 3 compute and 8 memory slices."
    )

    said = confirm_in_admin(card, carol)
    assert said == [
        "gpu-a100/GPU 0: MIG on, 7 compute and 8 memory slices → MIG on, 3 compute and 8 memory slices confirmed; "
        "3 slice(s) bookable (3g.40gb, 2g.20gb, 2g.20gb)."
    ]
    card.refresh_from_db()
    assert card.compute_slices == 3 and CardLayout.waiting(card) is None and card.is_bookable
    assert [period.gpus for period in held_periods(user=alice, start=at(0), end=at(24))] == [Fraction(1)]
    assert weekly_refusal(alice, [gpus[1]]).startswith("weekly GPU-hours: 7 used + 2 asked > 4 allowed")
    assert api_book(bob, [piece(B)], 10, 11).status_code == 201  # alice is past her limit now
    assert not open_layout_alerts()
    alert.refresh_from_db()
    assert (alert.resolved_by, alert.resolution) == (carol, "the layout was confirmed")


def test_a_card_leaving_mig_mode_stays_out_of_booking_until_confirmed(card, report, gpus, alice, bob, carol):
    book(alice, [piece(B)], at(1), at(3))  # 2/7 of a GPU
    report(mig_card(gpus[0], A, B, C, current=True, pending=False))  # nvidia-smi -mig 0: off at the next reset
    card.refresh_from_db()
    assert card.mig_mode and CardLayout.waiting(card) == CardLayout(False, 7, 8)
    assert not any(s.bookable for s in card.slices.all())
    assert api_book(bob, [piece(A)], 4, 5).status_code == 400
    refused = api_book(bob, [card], 4, 5)  # not as one GPU either: nobody has said what it is now
    assert refused.status_code == 400
    assert "waits for an admin" in refused.json()["error"]["message"]
    assert len(open_layout_alerts()) == 1

    report(mig_card(gpus[0], current=False, pending=False))  # reset: the slices are gone
    assert all(s.gone_at is not None for s in card.slices.all())
    assert Alert.objects.filter(kind=Alert.Kind.SLICE_GONE, user=alice, resolved_at__isnull=True).exists()
    assert len(open_layout_alerts()) == 1 and api_book(bob, [card], 4, 5).status_code == 400

    assert confirm_in_admin(card, carol) == [
        "gpu-a100/GPU 0: MIG on, 7 compute and 8 memory slices → MIG off confirmed; it is booked as one GPU again."
    ]
    card.refresh_from_db()
    assert not card.mig_mode and card.is_bookable
    assert card.compute_slices == 7  # what alice's booking on the gone slice still counts by
    assert [period.gpus for period in held_periods(user=alice, start=at(0), end=at(24))] == [Fraction(2, 7)]
    booked = api_book(bob, [card], 4, 5)
    assert booked.status_code == 201, booked.content
    assert not open_layout_alerts()


def test_a_card_going_into_mig_mode_stops_being_booked_whole_until_confirmed(clock, report, gpus, alice, carol):
    assert api_book(alice, [gpus[2]], 1, 2).status_code == 201  # MIG off: one GPU
    report(mig_card(gpus[2], A, B))
    card = Gpu.objects.get(pk=gpus[2].pk)
    assert not card.mig_mode and CardLayout.waiting(card) == CardLayout(True, 7, 8)
    assert api_book(alice, [card], 3, 4).status_code == 400
    assert not card.is_bookable and len(open_layout_alerts()) == 1
    [node] = fleet_status()
    assert next(gpu["state"] for gpu in node["gpus"] if gpu["id"] == card.pk) == "not_bookable"  # the status page

    mig_layout_confirm(card=card, actor=carol)
    card.refresh_from_db()
    assert card.mig_mode and card.compute_slices == 7 and card.memory_slices == 8
    assert api_book(alice, [piece(A)], 3, 4).status_code == 201
    assert not open_layout_alerts()


def test_a_repeated_change_writes_nothing_and_a_newer_one_updates_the_one_alert(card, report, gpus):
    report(mig_card(gpus[0], A, B, C, compute=3))
    before = list(Gpu.objects.order_by("pk").values())
    report(mig_card(gpus[0], A, B, C, compute=3))
    assert list(Gpu.objects.order_by("pk").values()) == before
    assert len(open_layout_alerts()) == 1

    report(mig_card(gpus[0], A, B, C, compute=5))
    [alert] = open_layout_alerts()
    assert alert.details["reported"] == {"mig_mode": True, "compute_slices": 5, "memory_slices": 8}
    card.refresh_from_db()
    assert card.compute_slices == 7 and CardLayout.waiting(card) == CardLayout(True, 5, 8)

    # The node back at the confirmed layout: still the admin's to look at (it changed twice meanwhile).
    report(mig_card(gpus[0], A, B, C))
    card.refresh_from_db()
    assert CardLayout.waiting(card) == CardLayout(True, 7, 8) and not card.is_bookable


def test_other_memory_slices_wait_for_the_admin_too(card, report, gpus, carol):
    report(mig_card(gpus[0], A, B, C, memory=16))
    card.refresh_from_db()
    assert card.memory_slices == 8 and not card.is_bookable and len(open_layout_alerts()) == 1
    mig_layout_confirm(card=card, actor=carol)
    card.refresh_from_db()
    assert card.memory_slices == 16 and card.is_bookable


def test_memory_slices_not_recorded_before_are_recorded_without_asking(card, report, gpus):
    Gpu.objects.filter(pk=card.pk).update(memory_slices=None)  # a card confirmed before the portal kept them
    report(mig_card(gpus[0], A, B, C))
    card.refresh_from_db()
    assert card.memory_slices == 8 and card.is_bookable and all(s.bookable for s in card.slices.all())
    assert not open_layout_alerts()


def test_a_slice_reporting_other_compute_slices_keeps_its_share_until_confirmed(card, report, gpus, alice, carol):
    book(alice, [piece(A)], at(1), at(2))
    smaller = {**A, "compute_slices": 1}  # the same slice, "now 1 compute slice": 1/7 of a GPU
    report(mig_card(gpus[0], smaller, B, C))
    assert (piece(A).compute_slices, piece(A).reported_compute_slices, piece(A).bookable) == (3, 1, False)
    assert [period.gpus for period in held_periods(user=alice, start=at(0), end=at(24))] == [Fraction(3, 7)]
    assert piece(B).bookable and not open_layout_alerts()  # a slice's change waits alone, as before

    mig_layout_confirm(card=card, actor=carol)
    assert (piece(A).compute_slices, piece(A).reported_compute_slices, piece(A).bookable) == (1, None, True)
    assert [period.gpus for period in held_periods(user=alice, start=at(0), end=at(24))] == [Fraction(1, 7)]


def test_a_new_slice_on_a_card_whose_numbers_changed_waits_with_it(card, report, gpus, carol):
    D = slice_(4, "1g.10gb", 7, 1, 1)
    report(mig_card(gpus[0], A, B, D, compute=5))
    assert not piece(D).bookable and piece(C).gone_at is not None
    confirmed = mig_layout_confirm(card=card, actor=carol)
    assert [s.uuid for s in confirmed] == [A["uuid"], B["uuid"], D["uuid"]]
    assert Gpu.objects.get(pk=card.pk).compute_slices == 5


def test_the_cards_admin_page_shows_the_change_waiting(card, report, gpus, carol, client):
    report(mig_card(gpus[0], A, B, C, compute=3))
    client.force_login(carol)
    page = client.get(reverse("admin:nodes_gpu_change", args=[card.pk])).content.decode()
    assert "MIG on, 7 compute and 8 memory slices → MIG on, 3 compute and 8 memory slices" in page
    listed = client.get(reverse("admin:nodes_gpu_changelist") + "?mig_change_at__isempty=0").content.decode()
    assert "gpu-a100/GPU 0" in listed and "GPU 1" not in listed
