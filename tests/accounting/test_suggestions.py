"""Suggestions from demand (accounting/suggestions.py, GET /api/v1/availability/suggest/): free slots of the
same size near an asked one, ranked by how contended those hours were on past weeks and by the energy price,
with the figures they were ranked on; and the availability finder's packing of whole nodes."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from accounting.models import Tariff
from tests.api_helpers import client_for
from tests.conftest import at
from tests.factories import book, carve_mig, node_with_gpus

SUGGEST = "/api/v1/availability/suggest/"
TUESDAY_10 = at(hours=25)  # the clock stands at Monday 09:00 UTC


@pytest.fixture
def demand(clock, bob, gpus):
    """Eight past weeks: every Tuesday 10:00-14:00 all four GPUs booked (100 % of the fleet), every Tuesday
    20:00-22:00 one of them (25 %). Nothing else, so those six hours are the week's busiest quarter."""
    for week in range(1, 9):
        tuesday = TUESDAY_10 - timedelta(weeks=week)
        book(bob, gpus, tuesday, tuesday + timedelta(hours=4), direct=True)
        book(bob, gpus[:1], tuesday + timedelta(hours=10), tuesday + timedelta(hours=12), direct=True)


def ask(user, **params):
    query = {"gpus": 2, "hours": 2, "start": TUESDAY_10.isoformat(), **params}
    answer = client_for(user).get(SUGGEST, query)
    assert answer.status_code == 200, answer.json()
    return answer.json()


def starts(answer) -> list[str]:
    return [item["start"][11:16] for item in answer["suggestions"]]


def test_a_busy_hour_is_said_with_its_figures_and_quiet_free_slots_come_first(demand, alice):
    answer = ask(alice)

    asked = answer["asked"]
    assert (asked["free"], asked["busy"], answer["offer"]) == (True, True, True)
    assert (asked["contention_pct"], asked["busiest_pct"]) == (100.0, 100.0)
    assert asked["why"] == "busy hour: 100 % of GPUs booked on past Tuesdays at 10:00; 100 % over the slot"
    # The ten nearest free two-hour slots that do not overlap each other (10, 08, 12, 06, 14, 04, 16, 02, 18,
    # 00), quiet ones first, nearest first among equals: those touching 10-14 or 20-22 come last.
    assert starts(answer) == ["08:00", "06:00", "14:00", "04:00", "16:00"]
    first = answer["suggestions"][0]
    assert (first["node"], first["gpu_indexes"], first["busy"], first["contention_pct"]) == (
        "gpu-a100",
        [0, 1],
        False,
        0,
    )
    assert first["why"] == "busiest hour: 0 % of GPUs booked on past Tuesdays at 08:00; 0 % over the slot"
    assert (answer["history_weeks"], answer["fleet_gpus"]) == (8, 4)


def test_the_contention_of_a_slot_is_the_mean_of_its_hours(demand, alice):
    asked = ask(alice, hours=4, start=(TUESDAY_10 + timedelta(hours=8)).isoformat())["asked"]  # 18:00-22:00
    # In the busiest quarter of the week's hours, but a quarter of the fleet booked is no crowd: not busy.
    assert (asked["contention_pct"], asked["busiest_pct"], asked["busy"]) == (12.5, 25.0, False)
    assert asked["why"].startswith("busiest hour: 25 % of GPUs booked on past Tuesdays at 20:00")


def test_a_light_history_makes_no_hour_busy(clock, alice, bob, gpus):
    book(bob, gpus[:1], TUESDAY_10 - timedelta(weeks=3), TUESDAY_10 - timedelta(weeks=3, hours=-1), direct=True)
    answer = ask(alice)
    assert (answer["asked"]["busiest_pct"], answer["asked"]["busy"], answer["offer"]) == (3.1, False, False)


def test_hours_are_the_persons_own_even_half_an_hour_off_utc(clock, alice, bob, gpus):
    """India is UTC+05:30: Tuesdays 11:00-12:00 there (05:30-06:30 UTC) were fully booked; 10:30-11:30 is half
    in that hour."""
    alice.timezone = "Asia/Kolkata"
    alice.save()
    eleven = TUESDAY_10 - timedelta(hours=4, minutes=30)  # 05:30 UTC
    for week in range(1, 9):
        book(bob, gpus, eleven - timedelta(weeks=week), eleven - timedelta(weeks=week, hours=-1), direct=True)

    asked = ask(alice, hours=1, start=(eleven - timedelta(minutes=30)).isoformat())["asked"]

    assert (asked["contention_pct"], asked["busiest_pct"], asked["busy"]) == (50.0, 100.0, True)
    assert asked["why"].startswith("busy hour: 100 % of GPUs booked on past Tuesdays at 11:00")


def test_mig_slices_are_suggested_as_slices_of_their_profile(clock, alice, bob, gpus):
    slices = carve_mig(gpus[0])
    book(bob, slices[:1], TUESDAY_10, TUESDAY_10 + timedelta(hours=2))  # the only 3g.40gb, 10:00-12:00

    answer = ask(alice, gpus=1, profile="3g.40gb")

    assert answer["asked"]["free"] is False  # a whole card is free then, but no 3g.40gb slice
    assert starts(answer)[:2] == ["08:00", "12:00"]  # just before and after bob's (the earlier of equals first)
    assert {tuple(item["gpus"]) for item in answer["suggestions"]} == {(slices[0].pk,)}


def test_a_slot_past_the_calendars_end_is_refused_in_words(alice):
    answer = client_for(alice).get(SUGGEST, {"gpus": 1, "hours": 8, "start": "2999-12-31T20:00:00Z"})
    assert answer.status_code == 400
    assert "would end after the last date the portal keeps (3000-01-01)" in str(answer.json())


def test_where_tariffs_are_set_cheaper_hours_rank_before_dearer_ones_of_the_same_contention(demand, alice):
    Tariff.objects.create(name="day", price_per_kwh=Decimal("0.30"))
    Tariff.objects.create(name="night", price_per_kwh=Decimal("0.10"), hour_from=0, hour_until=5)

    answer = ask(alice)

    # 02:00 and 00:00 are all night; 04:00-06:00 is half night; 08:00 and 06:00 are day.
    assert starts(answer) == ["02:00", "00:00", "04:00", "08:00", "06:00"]
    assert [item["price_per_kwh"] for item in answer["suggestions"]] == [
        "0.1000",
        "0.1000",
        "0.2000",
        "0.3000",
        "0.3000",
    ]
    assert answer["suggestions"][2]["why"].endswith("; energy 0.200 EUR/kWh")


def test_a_slot_without_room_is_said_so_and_no_suggestion_overlaps_what_is_taken(demand, alice, bob, gpus):
    book(bob, gpus[1:], TUESDAY_10 - timedelta(hours=3), TUESDAY_10 + timedelta(hours=3))  # 07:00-13:00

    answer = ask(alice)

    assert (answer["asked"]["free"], answer["offer"]) == (False, True)
    # Only GPU 0 is free from 07:00 to 13:00: two GPUs fit before or after. Kept: 13, 05, 15, 03, 17, 01, 19
    # and three on Monday evening; 13:00 and 19:00 touch the busy hours.
    assert starts(answer) == ["05:00", "15:00", "03:00", "17:00", "01:00"]


def test_a_quiet_free_slot_offers_nothing(demand, alice):
    answer = ask(alice, start=(TUESDAY_10 + timedelta(days=1)).isoformat())  # Wednesday
    assert (answer["asked"]["free"], answer["asked"]["busy"], answer["offer"]) == (True, False, False)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"start": "2030-01-08T10:00:00"}, "start"),  # no zone
        ({"start": "2029-01-08T10:00:00Z"}, "start"),  # past
        ({"gpus": 0}, "gpus"),
        ({"hours": 0}, "hours"),
        ({"start": "tomorrow"}, "start"),
    ],
)
def test_bad_questions_are_refused_in_words(clock, alice, params, field):
    query = {"gpus": 2, "hours": 2, "start": TUESDAY_10.isoformat(), **params}
    answer = client_for(alice).get(SUGGEST, query)
    assert answer.status_code == 400
    assert field in answer.json()["error"]["details"]["fields"]
    assert client_for(None).get(SUGGEST, query).status_code == 401


# --- packing ------------------------------------------------------------------------------------------


@pytest.fixture
def two_nodes(clock, bob):
    """ "a-idle" with nothing booked, "z-busy" with GPU 0 booked over the next day."""
    node_with_gpus(2, name="a-idle")
    busy = node_with_gpus(2, name="z-busy")
    book(bob, [busy.gpus.get(index=0)], at(), at(hours=24))


def test_windows_go_to_the_first_node_by_name_unless_packing_prefers_a_node_in_use(two_nodes, alice, settings):
    query = {"gpus": 1, "hours": 2}
    answer = client_for(alice).get("/api/v1/availability/", query).json()["results"]
    assert [w["node"] for w in answer] == ["a-idle", "z-busy"]
    suggested = ask(alice, gpus=1, start=at(hours=1).isoformat())["suggestions"]
    assert {item["node"] for item in suggested} == {"a-idle"}

    settings.AVAILABILITY_PACK_NODES = True
    answer = client_for(alice).get("/api/v1/availability/", query).json()["results"]
    assert [(w["node"], w["gpu_indexes"]) for w in answer] == [("z-busy", [1]), ("a-idle", [0])]
    suggested = ask(alice, gpus=1, start=at(hours=1).isoformat())["suggestions"]
    while_in_use = [item["node"] for item in suggested if item["end"][:19] <= at(hours=24).isoformat()[:19]]
    assert while_in_use and set(while_in_use) == {"z-busy"}
