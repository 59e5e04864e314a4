"""Reserved capacity for groups (reservations/reserved.py): only members book inside an unreleased occurrence,
named GPUs or any N GPUs of a node, once or weekly across DST; every path that takes a slot applies it (a
booking, the API, a series occurrence, an extension, a waitlist offer); release lets everyone in and is
announced once; admin refuses what could not apply; the calendar shows the band; availability skips it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Group
from django.core import checks
from django.db import transaction
from django.urls import reverse
from django.utils import timezone

from audit.models import AuditEntry
from reservations.exceptions import ReservedConflict
from reservations.models import Reservation, ReservedCapacity, ReservedRelease
from reservations.offers import offer_create
from reservations.reserved import occurrence_periods
from reservations.series import BOOKED, REFUSED, series_create
from reservations.services import reservation_create, reservation_extend
from reservations.signals import reserved_capacity_released
from reservations.tasks import release_reserved_capacity
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import UserFactory, book, carve_mig, node_with_gpus

BERLIN = ZoneInfo("Europe/Berlin")
pytestmark = pytest.mark.usefixtures("clock")


@pytest.fixture
def vision(alice):
    group = Group.objects.create(name="vision")
    alice.groups.add(group)
    return group


def reserve(group, node, *, gpus=(), count=None, start=None, end=None, **fields) -> ReservedCapacity:
    reserved = ReservedCapacity.objects.create(
        group=group, node=node, count=count, start=start or at(1), end=end or at(4), **fields
    )
    reserved.gpus.set(gpus)
    return reserved


# --- named GPUs ------------------------------------------------------------------------------------


def test_a_non_member_is_refused_inside_a_reserved_gpu_with_the_group_named(bob, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[2]])

    with pytest.raises(ReservedConflict) as refused:
        reservation_create(user=bob, gpus=[gpus[1], gpus[2]], start=at(2), end=at(3))

    assert refused.value.message == (
        "GPU 2 on gpu-a100 is reserved for group vision Mon 7 Jan 2030, 10:00–13:00 UTC: "
        "ask a member to book it, or book outside it."
    )
    assert refused.value.code == "reserved"
    assert refused.value.details["reserved"]["group"] == "vision"
    assert refused.value.details["gpus"] == [gpus[2].pk]
    assert not Reservation.objects.exists()


def test_members_and_admins_book_inside_and_anyone_outside(alice, bob, carol, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[2]])

    mine = reservation_create(user=alice, gpus=[gpus[2]], start=at(1), end=at(2))
    for_bob = reservation_create(user=bob, gpus=[gpus[2]], start=at(2), end=at(3), actor=carol)
    before = reservation_create(user=bob, gpus=[gpus[2]], start=at(0), end=at(1))
    after = reservation_create(user=bob, gpus=[gpus[2]], start=at(4), end=at(5))
    beside = reservation_create(user=bob, gpus=[gpus[3]], start=at(1), end=at(4))

    assert all(r.status == Reservation.Status.APPROVED for r in (mine, for_bob, before, after, beside))


def test_the_refusal_names_the_window_in_the_readers_zone(bob, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[0], gpus[1]])

    with timezone.override(BERLIN), pytest.raises(ReservedConflict) as refused:
        reservation_create(user=bob, gpus=gpus[:2], start=at(1), end=at(2))

    assert refused.value.message.startswith(
        "GPU 0, GPU 1 on gpu-a100 are reserved for group vision Mon 7 Jan 2030, 11:00–14:00 CET:"
    )


def test_the_api_answers_409_with_its_own_code_and_picks_around_reserved_gpus(alice, bob, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[0]])
    body = {"gpus": [gpus[0].pk], "start": at(1).isoformat(), "end": at(2).isoformat()}

    refused = client_for(bob).post("/api/v1/reservations/", body, format="json")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "reserved"
    assert error["message"].startswith("GPU 0 on gpu-a100 is reserved for group vision Mon 7 Jan 2030, 10:00–13:00")
    assert error["details"]["reserved"]["node"] == "gpu-a100"

    by_count = {"node": "gpu-a100", "gpu_count": 4, "start": at(1).isoformat(), "end": at(2).isoformat()}
    short = client_for(bob).post("/api/v1/reservations/", by_count, format="json")
    assert short.status_code == 409
    assert short.json()["error"]["message"] == (
        "Only 3 of the 4 GPUs asked are free on gpu-a100 for that slot (1 more is reserved for a group you are not in)."
    )
    picked = client_for(bob).post("/api/v1/reservations/", {**by_count, "gpu_count": 3}, format="json")
    assert picked.status_code == 201, picked.content
    assert [gpu["index"] for gpu in picked.json()["gpus"]] == [1, 2, 3]
    member = client_for(alice).post("/api/v1/reservations/", {**by_count, "gpu_count": 1}, format="json")
    assert [gpu["index"] for gpu in member.json()["gpus"]] == [0]


# --- MIG: a slice of a reserved card, the card of a reserved slice -------------------------------------


def test_a_slice_of_a_reserved_card_and_the_card_of_a_reserved_slice_are_refused(alice, bob, vision, node, gpus):
    big, small, other = carve_mig(gpus[0])
    reserve(vision, node, gpus=[gpus[0]], start=at(1), end=at(4))
    reserve(vision, node, gpus=[big], start=at(5), end=at(8))

    with pytest.raises(ReservedConflict, match=r"^GPU 0 slice 3g.40gb@0 on gpu-a100 is reserved for group vision"):
        reservation_create(user=bob, gpus=[big], start=at(2), end=at(3))
    with pytest.raises(ReservedConflict, match=r"^GPU 0 slice 3g.40gb@0 on gpu-a100 is reserved"):
        reservation_create(user=bob, gpus=[gpus[0]], start=at(6), end=at(7))  # the card books all its slices
    # Another slice of the card is not the reserved slice's part of it.
    assert reservation_create(user=bob, gpus=[small], start=at(6), end=at(7)).status == Reservation.Status.APPROVED
    assert reservation_create(user=alice, gpus=[other], start=at(2), end=at(3)).status == Reservation.Status.APPROVED


# --- any N GPUs of the node --------------------------------------------------------------------------


def test_any_n_of_the_node_holds_back_n_and_members_do_not_count(alice, bob, vision, node, gpus):
    dave, eve = UserFactory(username="dave"), UserFactory(username="eve")
    reserve(vision, node, count=2)

    reservation_create(user=alice, gpus=gpus[:1], start=at(1), end=at(4))  # members' bookings are not counted
    reservation_create(user=bob, gpus=gpus[1:2], start=at(1), end=at(2))
    reservation_create(user=dave, gpus=gpus[2:3], start=at(1), end=at(4))  # others now hold the 2 left to them

    with pytest.raises(ReservedConflict) as refused:
        reservation_create(user=eve, gpus=gpus[3:4], start=at(1), end=at(2))
    assert refused.value.message == (
        "2 of the 4 GPUs of gpu-a100 are reserved for group vision Mon 7 Jan 2030, 10:00–13:00 UTC: "
        "others hold 2 and ask 1, more than the 2 left to them. Ask a member to book it, or book outside it."
    )
    assert (refused.value.details["held"], refused.value.details["allowed"]) == (2.0, 2)
    # Bob's slot ended at 11:00: from then on, one is left to the others.
    assert reservation_create(user=eve, gpus=gpus[1:2], start=at(2), end=at(4)).status == "approved"
    assert reservation_create(user=alice, gpus=gpus[3:4], start=at(1), end=at(4)).status == "approved"


def test_any_n_refuses_the_non_member_who_would_take_the_last_reserved_gpu(alice, bob, vision, node, gpus):
    reserve(vision, node, count=2)
    reservation_create(user=bob, gpus=gpus[:2], start=at(1), end=at(4))

    with pytest.raises(ReservedConflict) as refused:
        reservation_create(user=UserFactory(username="dave"), gpus=gpus[2:3], start=at(2), end=at(3))

    assert refused.value.message == (
        "2 of the 4 GPUs of gpu-a100 are reserved for group vision Mon 7 Jan 2030, 10:00–13:00 UTC: "
        "others hold 2 and ask 1, more than the 2 left to them. Ask a member to book it, or book outside it."
    )
    assert reservation_create(user=alice, gpus=gpus[2:4], start=at(2), end=at(3)).status == "approved"


# --- a weekly window across a DST change ------------------------------------------------------------


def test_a_weekly_window_keeps_its_berlin_wall_clock_time_across_the_spring_change(bob, vision, node, gpus):
    # Mondays 09:00-12:00 in Berlin from 18 March to 15 April 2030; clocks go forward on Sunday 31 March.
    reserved = reserve(
        vision,
        node,
        gpus=[gpus[0]],
        start=datetime(2030, 3, 18, 9, tzinfo=BERLIN),
        end=datetime(2030, 3, 18, 12, tzinfo=BERLIN),
        rule="FREQ=WEEKLY;BYDAY=MO;UNTIL=20300415",
        zone="Europe/Berlin",
    )

    periods = occurrence_periods(reserved)
    assert [(s.astimezone(UTC).strftime("%m-%d %H:%M"), e.strftime("%H:%M")) for s, e in periods] == [
        ("03-18 08:00", "11:00"),
        ("03-25 08:00", "11:00"),
        ("04-01 07:00", "10:00"),
        ("04-08 07:00", "10:00"),
        ("04-15 07:00", "10:00"),
    ]
    summer = datetime(2030, 4, 1, 7, 0, tzinfo=UTC)  # 09:00 in Berlin
    with timezone.override(BERLIN), pytest.raises(ReservedConflict) as refused:
        reservation_create(user=bob, gpus=[gpus[0]], start=summer, end=summer + timedelta(minutes=30))
    assert "reserved for group vision Mon 1 Apr 2030, 09:00–12:00 CEST" in refused.value.message
    with pytest.raises(ReservedConflict):
        reservation_create(
            user=bob,
            gpus=[gpus[0]],
            start=datetime(2030, 3, 25, 8, tzinfo=UTC),
            end=datetime(2030, 3, 25, 9, tzinfo=UTC),
        )
    # 10:00-11:00 UTC is noon in Berlin in summer: after the window (in winter it was inside).
    assert reservation_create(
        user=bob, gpus=[gpus[0]], start=summer + timedelta(hours=3), end=summer + timedelta(hours=4)
    )


# --- every path that takes a slot -----------------------------------------------------------------------


def test_an_extension_into_reserved_time_is_refused_for_a_non_member(alice, bob, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[2], gpus[3]])
    bobs = reservation_create(user=bob, gpus=[gpus[2]], start=at(0), end=at(1))
    alices = reservation_create(user=alice, gpus=[gpus[3]], start=at(0), end=at(1))

    with pytest.raises(ReservedConflict, match=r"^GPU 2 on gpu-a100 is reserved for group vision"):
        reservation_extend(reservation=bobs, actor=bob, end=at(2))

    bobs.refresh_from_db()
    assert bobs.end == at(1)
    assert reservation_extend(reservation=alices, actor=alice, end=at(2)).end == at(2)


def test_the_page_shows_a_refused_extension_inline_with_the_group_named(bob, vision, node, gpus, client):
    reserve(vision, node, gpus=[gpus[2]])
    bobs = reservation_create(user=bob, gpus=[gpus[2]], start=at(0), end=at(1))
    client.force_login(bob)

    response = client.post(
        reverse("reservation-action", args=[bobs.pk, "extend"]),
        {"hours": "2", "next": reverse("my-reservations")},
        follow=True,
    )

    assert response.status_code == 200
    (message,) = [str(m) for m in response.context["messages"]]
    assert message == (
        "GPU 2 on gpu-a100 is reserved for group vision Mon 7 Jan 2030, 10:00–13:00 UTC: "
        "ask a member to book it, or book outside it."
    )
    assert "reserved for group vision" in response.content.decode()
    bobs.refresh_from_db()
    assert bobs.end == at(1)


def test_a_series_occurrence_inside_reserved_time_is_skipped_and_reported(bob, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[0]], start=at(days=7), end=at(days=7, hours=2))

    report = series_create(
        user=bob, gpus=[gpus[0]], start=at(), end=at(hours=1), rule="FREQ=WEEKLY;COUNT=3", zone="UTC", mode="skip"
    )

    assert [o.outcome for o in report.occurrences] == [BOOKED, REFUSED, BOOKED]
    assert report.occurrences[1].code == "reserved"
    assert report.occurrences[1].message.startswith("GPU 0 on gpu-a100 is reserved for group vision Mon 14 Jan 2030")


def test_a_waitlist_offer_never_lands_in_reserved_time_for_a_non_member(alice, bob, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[1]])

    with pytest.raises(ReservedConflict), transaction.atomic():
        offer_create(user=bob, gpus=[gpus[1]], start=at(1), end=at(2), now=at())

    assert not Reservation.objects.filter(user=bob).exists()
    offer = offer_create(user=alice, gpus=[gpus[1]], start=at(1), end=at(2), now=at())
    assert offer.status == Reservation.Status.OFFERED


def test_a_waitlist_offer_counts_against_any_n(bob, vision, node, gpus):
    reserve(vision, node, count=3)
    book(bob, [gpus[0]], at(1), at(2))

    with pytest.raises(ReservedConflict, match="others hold 1 and ask 1, more than the 1 left to them"):
        offer_create(user=UserFactory(username="dave"), gpus=[gpus[1]], start=at(1), end=at(2), now=at())


# --- release -------------------------------------------------------------------------------------------


@pytest.fixture
def released_signals():
    calls = {"in_transaction": [], "on_commit": []}

    def in_transaction(sender, **kwargs):
        calls["in_transaction"].append(kwargs)

    def on_commit(sender, **kwargs):
        calls["on_commit"].append(kwargs)

    reserved_capacity_released.in_transaction.connect(in_transaction, weak=False)
    reserved_capacity_released.on_commit.connect(on_commit, weak=False)
    yield calls
    reserved_capacity_released.in_transaction.disconnect(in_transaction)
    reserved_capacity_released.on_commit.disconnect(on_commit)


def test_release_lets_everyone_book_and_is_announced_exactly_once(
    bob, vision, node, gpus, clock, released_signals, django_capture_on_commit_callbacks
):
    reserved = reserve(vision, node, gpus=[gpus[1]], start=at(5), end=at(8), release_hours_before=2)

    with pytest.raises(ReservedConflict):
        reservation_create(user=bob, gpus=[gpus[1]], start=at(5), end=at(6))
    with django_capture_on_commit_callbacks(execute=True):
        assert release_reserved_capacity() == 0  # not yet
    assert released_signals["in_transaction"] == []

    clock.move_to(at(3, days=0) + timedelta(minutes=1))
    assert reservation_create(user=bob, gpus=[gpus[1]], start=at(5), end=at(6)).status == "approved"
    with django_capture_on_commit_callbacks(execute=True):
        assert release_reserved_capacity() == 1
    with django_capture_on_commit_callbacks(execute=True):
        assert release_reserved_capacity() == 0  # the second run announces nothing again

    (sent,) = released_signals["on_commit"]
    (also,) = released_signals["in_transaction"]
    assert {**also, "signal": None} == {**sent, "signal": None}
    assert sent["node"] == node and sent["gpu_ids"] == [gpus[1].pk] and sent["count"] is None
    assert (sent["start"], sent["end"]) == (at(5), at(8))
    assert sent["reserved"] == reserved
    assert ReservedRelease.objects.get().occurrence_start == at(5)


def test_a_failing_receiver_leaves_its_release_to_the_next_run_and_the_others_go_out(vision, node, gpus, clock, caplog):
    first = reserve(vision, node, gpus=[gpus[0]], start=at(5), end=at(6), release_hours_before=2)
    reserve(vision, node, gpus=[gpus[1]], start=at(5), end=at(6), release_hours_before=2)
    clock.move_to(at(4))

    def refuse_first(sender, reserved, **kwargs):
        if reserved == first:
            raise RuntimeError("waitlist down")

    reserved_capacity_released.in_transaction.connect(refuse_first, weak=False)
    try:
        assert release_reserved_capacity() == 1
    finally:
        reserved_capacity_released.in_transaction.disconnect(refuse_first)

    assert list(ReservedRelease.objects.values_list("reserved__gpus", flat=True)) == [gpus[1].pk]
    assert f"Announcing the release of reserved capacity #{first.pk}" in caplog.text
    assert release_reserved_capacity() == 1  # the next run announces the one that failed
    assert release_reserved_capacity() == 0
    assert ReservedRelease.objects.count() == 2


def test_the_site_default_releases_windows_without_their_own_hours(bob, vision, node, gpus, clock, settings):
    settings.RESERVED_RELEASE_HOURS = 1
    reserve(vision, node, count=4, start=at(5), end=at(6))
    never = reserve(vision, node, gpus=[gpus[3]], start=at(5), end=at(6), release_hours_before=0)

    clock.move_to(at(4))
    assert reservation_create(user=bob, gpus=gpus[:3], start=at(5), end=at(6)).status == "approved"
    with pytest.raises(ReservedConflict):
        reservation_create(user=bob, gpus=[gpus[3]], start=at(5), end=at(6))
    assert release_reserved_capacity() == 1
    assert not ReservedRelease.objects.filter(reserved=never).exists()


# --- admin -----------------------------------------------------------------------------------------


@pytest.fixture
def admin_client(client, carol):
    client.force_login(carol)
    return client


def _admin_form(**fields):
    form = {
        "label": "",
        "start_0": "2030-01-07",
        "start_1": "10:00:00",
        "end_0": "2030-01-07",
        "end_1": "13:00:00",
        "rule": "",
        "zone": "",
        "release_hours_before": "",
        "count": "",
        "releases-TOTAL_FORMS": "0",
        "releases-INITIAL_FORMS": "0",
        "releases-MIN_NUM_FORMS": "0",
        "releases-MAX_NUM_FORMS": "1000",
    }
    return {**form, **fields}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"end_1": "09:00:00", "count": "1"}, "The end must be after the start."),
        ({"count": "5"}, "gpu-a100 has 4 bookable GPUs: reserve at most 4 of them."),
        ({}, "Choose the GPUs to reserve, or give a count (any N GPUs of the node)."),
        ({"count": "1", "gpus": "first"}, "Reserve either named GPUs or a count of the node&#x27;s GPUs, not both."),
        ({"gpus": "elsewhere"}, "gpu-h100/GPU 0 not on node gpu-a100: choose GPUs of gpu-a100."),
        ({"count": "1", "release_hours_before": "2147483647"}, "Release at most 8784 hours (a year) before the start."),
        ({"count": "1", "rule": "FREQ=WEEKLY"}, "The repeat rule must end: add UNTIL=YYYYMMDD"),
        ({"count": "1", "rule": "FREQ=HOURLY;COUNT=3"}, "FREQ=HOURLY repeats more than once a day"),
        (
            {"count": "1", "rule": "FREQ=DAILY;COUNT=2", "zone": "Mars/Olympus"},
            "Unknown time zone &#x27;Mars/Olympus&#x27;",
        ),
    ],
)
def test_admin_refuses_what_could_not_apply_with_a_clear_message(admin_client, vision, node, gpus, fields, message):
    other = node_with_gpus(1, name="gpu-h100")
    choice = {"first": [gpus[0].pk], "elsewhere": [other.gpus.get().pk]}
    if "gpus" in fields:
        fields = {**fields, "gpus": choice[fields["gpus"]]}
    form = _admin_form(group=vision.pk, node=node.pk, **fields)

    refused = admin_client.post(reverse("admin:reservations_reservedcapacity_add"), form)

    assert refused.status_code == 200
    assert message in refused.content.decode()
    assert not ReservedCapacity.objects.exists()


def test_admin_saves_a_valid_window_audited_and_it_applies_at_once(admin_client, bob, vision, node, gpus):
    form = _admin_form(group=vision.pk, node=node.pk, gpus=[gpus[2].pk], label="paper deadline")

    created = admin_client.post(reverse("admin:reservations_reservedcapacity_add"), form)

    assert created.status_code == 302, created.content.decode()
    reserved = ReservedCapacity.objects.get()
    assert reserved.created_by.username == "carol"
    assert AuditEntry.objects.filter(action="reservedcapacity.create").exists()
    with pytest.raises(ReservedConflict):
        reservation_create(user=bob, gpus=[gpus[2]], start=at(1), end=at(2))
    listed = admin_client.get(reverse("admin:reservations_reservedcapacity_changelist"))
    assert "GPU 2" in listed.content.decode() and "never" in listed.content.decode()


@pytest.mark.parametrize(("value", "refused"), [(0, False), (48, False), (-1, True), (10**9, True)])
def test_a_site_default_release_outside_zero_to_a_year_stops_the_portal(settings, value, refused):
    settings.RESERVED_RELEASE_HOURS = value

    errors = [message for message in checks.run_checks() if message.id == "reservations.E002"]

    assert bool(errors) == refused
    if refused:
        assert errors[0].msg.startswith(f"RESERVED_RELEASE_HOURS={value}: give the hours before")


# --- calendar and availability ---------------------------------------------------------------------------


def _calendar(user):
    response = client_for(user).get("/api/v1/calendar/", {"start": at(-9).isoformat(), "end": at(15).isoformat()})
    assert response.status_code == 200, response.content
    return [event for event in response.json()["events"] if event["extendedProps"]["kind"] == "reserved"]


def test_the_calendar_shows_a_labelled_band_on_the_reserved_rows(alice, bob, vision, node, gpus, clock):
    carve_mig(gpus[1])
    reserve(vision, node, gpus=[gpus[0], gpus[1]])
    reserve(vision, node, count=2, start=at(5), end=at(6), label="course")
    reserve(vision, node, gpus=[gpus[3]], start=at(10), end=at(12), release_hours_before=11)  # released already

    named, counted = _calendar(bob)

    slices = [f"gpu-{pk}" for pk in gpus[1].slices.order_by("placement_start").values_list("pk", flat=True)]
    assert named["title"] == "reserved: vision"
    assert named["display"] == "background" and named["classNames"] == ["reserved"]
    assert named["resourceIds"] == [f"gpu-{gpus[0].pk}", f"gpu-{gpus[1].pk}", *slices]
    assert (named["start"], named["end"]) == (at(1).isoformat(), at(4).isoformat())
    assert named["extendedProps"]["member"] is False
    assert counted["title"] == "2 GPUs reserved for vision (course)"
    assert counted["resourceIds"] == [f"node-{node.pk}"]
    assert [event["extendedProps"]["member"] for event in _calendar(alice)] == [True, True]


def test_availability_skips_reserved_gpus_for_non_members_only(alice, bob, vision, node, gpus):
    reserve(vision, node, gpus=[gpus[0]], start=at(0), end=at(3))
    reserve(vision, node, count=2, start=at(3), end=at(6))
    query = {"gpus": 4, "hours": 1, "node": "gpu-a100"}

    (for_bob,) = client_for(bob).get("/api/v1/availability/", query).json()["results"]
    (for_alice,) = client_for(alice).get("/api/v1/availability/", query).json()["results"]
    (three,) = client_for(bob).get("/api/v1/availability/", {**query, "gpus": 3}).json()["results"]
    (two_later,) = (
        client_for(bob).get("/api/v1/availability/", {**query, "gpus": 2, "after": at(3).isoformat()}).json()["results"]
    )

    def start(window):
        return datetime.fromisoformat(window["start"])

    assert start(for_bob) == at(6)
    assert start(for_alice) == at(0)
    assert start(three) == at(0) and three["gpu_indexes"] == [1, 2, 3]
    assert start(two_later) == at(3)


def test_suggestions_skip_reserved_gpus_for_non_members_only(alice, bob, vision, node, gpus):
    """GPUs 0-2 are vision's from 10:00 to 13:00: bob is offered GPU 3 then, or the three after 13:00; alice, a
    member, the asked time."""
    reserve(vision, node, gpus=gpus[:3], start=at(1), end=at(4))
    query = {"gpus": 3, "hours": 1, "start": at(1).isoformat()}

    for_bob = client_for(bob).get("/api/v1/availability/suggest/", query).json()
    for_alice = client_for(alice).get("/api/v1/availability/suggest/", query).json()

    assert (for_bob["asked"]["free"], for_alice["asked"]["free"]) == (False, True)
    assert for_bob["suggestions"] and all(
        datetime.fromisoformat(item["end"]) <= at(1) or datetime.fromisoformat(item["start"]) >= at(4)
        for item in for_bob["suggestions"]
    )
    assert datetime.fromisoformat(for_alice["suggestions"][0]["start"]) == at(1)
    one = client_for(bob).get("/api/v1/availability/suggest/", {**query, "gpus": 1}).json()
    assert one["suggestions"][0]["gpu_indexes"] == [3] and datetime.fromisoformat(one["suggestions"][0]["start"]) == at(
        1
    )
