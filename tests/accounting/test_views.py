"""The usage report over the API, on the page and as CSV: who sees what, and bad periods."""

from __future__ import annotations

import csv
import io
from decimal import Decimal

import pytest
from django.test import Client

from accounting.models import Tariff
from tests.accounting.test_report import day  # noqa: F401 (the fixture)
from tests.api_helpers import client_for

pytestmark = pytest.mark.usefixtures("clock")
PERIOD = {"start": "2030-01-07T00:00:00Z", "end": "2030-01-08T00:00:00Z"}


def page_for(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_api_gives_admins_everyone_and_researchers_themselves(day, alice, carol):  # noqa: F811
    admin = client_for(carol).get("/api/v1/reports/usage/", PERIOD | {"by": "user"}).json()
    assert {row["label"]: row["used_gpu_hours"] for row in admin["rows"]} == {"alice": 2.0, "bob": 0.0, "carol": 0.0}
    assert admin["total"]["booked_gpu_hours"] == 10.0
    assert admin["used_threshold_pct"] == 10
    own = client_for(alice).get("/api/v1/reports/usage/", PERIOD | {"by": "node"}).json()
    assert [(row["label"], row["booked_gpu_hours"]) for row in own["rows"]] == [("gpu-a100", 5.0)]
    demand = client_for(carol).get("/api/v1/reports/demand/", PERIOD | {"zone": "UTC"}).json()
    assert demand["hours"][0][10] == 3.0 and [0, 10] in demand["peak"]


@pytest.mark.parametrize(
    ("params", "field", "words"),
    [
        ({"start": "2030-01-08T00:00:00Z", "end": "2030-01-07T00:00:00Z"}, "end", "after the start"),
        ({"start": "2028-01-01T00:00:00Z", "end": "2030-01-07T00:00:00Z"}, "start", "at most 400 days"),
        ({"start": "2030-01-07T00:00:00"}, "start", "time zone"),
        ({"by": "planet"}, "by", "not a valid choice"),
    ],
)
def test_bad_periods_are_refused_in_words(alice, params, field, words):
    answer = client_for(alice).get("/api/v1/reports/usage/", params)
    assert answer.status_code == 400
    assert words in str(answer.json()["error"]["details"]["fields"][field])


def test_reports_need_a_login(db):
    assert client_for(None).get("/api/v1/reports/usage/").status_code == 401
    assert Client().get("/reports/").status_code == 302
    assert Client().get("/reports/usage.csv").status_code == 302


def test_the_page_shows_the_table_and_the_heatmaps_data(day, carol, alice):  # noqa: F811
    response = page_for(carol).get("/reports/", {"start": "2030-01-07", "end": "2030-01-07", "by": "user"})
    assert response.status_code == 200
    html = response.content.decode()
    assert '<th scope="row">alice</th>' in html and "40 %" in html  # alice's efficiency
    assert 'href="usage.csv?start=2030-01-07&amp;end=2030-01-07&amp;by=user"' in html
    own = page_for(alice).get("/reports/", {"start": "2030-01-07", "end": "2030-01-07"}).content.decode()
    assert '<th scope="row">bob</th>' not in own
    # Admins: the fleet's fully idle node-hours (held 10-12 and 13-17 of the day so far, 20:00), linked by node.
    assert "<strong>14 of 20 node-hours</strong> (70 %) had no booking" in html
    assert 'href="?start=2030-01-07&amp;end=2030-01-07&amp;by=node">by node</a>' in html
    assert 'id="idle-nodes"' not in own


def test_by_node_an_admin_sees_each_nodes_fully_idle_hours(day, carol):  # noqa: F811
    html = page_for(carol).get("/reports/", {"start": "2030-01-07", "end": "2030-01-07", "by": "node"}).content.decode()
    assert '<th scope="col" class="num">Fully idle node-h</th>' in html
    assert '<td class="num">14.0</td>\n      </tr>' in html
    api = client_for(carol).get("/api/v1/reports/usage/", PERIOD | {"by": "node"}).json()
    assert (api["idle_node_hours"], api["node_hours"], api["rows"][0]["idle_node_hours"]) == (14.0, 20.0, 14.0)


def test_the_page_explains_a_bad_period(alice):
    response = page_for(alice).get("/reports/", {"start": "2030-01-08", "end": "2030-01-07"})
    assert response.status_code == 400
    assert "The last day comes before the first" in response.content.decode()


def test_the_csv_has_the_tables_rows(day, carol):  # noqa: F811
    response = page_for(carol).get("/reports/usage.csv", {"start": "2030-01-07", "end": "2030-01-07", "by": "user"})
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert "gpu-usage-by-user-2030-01-07-2030-01-07.csv" in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0] == [
        "person",
        "bookings",
        "booked GPU-hours",
        "used GPU-hours",
        "unmeasured GPU-hours",
        "efficiency",
        "released early",
        "no-shows",
        "no-show GPU-hours",
        "energy kWh",
        "idle energy kWh",
        "energy estimated",
        "cost",
        "CO2e kg",
        "fully idle node-hours",  # by node only
    ]
    assert ["alice", "2", "5.0", "2.0", "0.0", "0.4", "1", "0", "0.0", "0.42", "0.12", "False", "", "", ""] in rows
    assert ["carol", "1", "1.0", "0.0", "0.0", "0.0", "0", "0", "0.0", "", "", "False", "", "", ""] in rows
    assert page_for(carol).get("/reports/usage.csv", {"start": "bad"}).status_code == 400


def test_with_tariffs_the_page_api_and_csv_price_the_energy(day, carol, settings):  # noqa: F811
    settings.TARIFF_CURRENCY = "CHF"
    Tariff.objects.create(name="day", price_per_kwh=Decimal("0.30"), co2_g_per_kwh=Decimal("400"))

    html = page_for(carol).get("/reports/", {"start": "2030-01-07", "end": "2030-01-07", "by": "user"}).content.decode()
    assert '<th scope="col" class="num">Cost CHF</th>' in html and "CO₂e kg" in html
    assert "0.13</td>" in html  # alice's 0.42 kWh at 0.30
    answer = client_for(carol).get("/api/v1/reports/usage/", PERIOD | {"by": "user"}).json()
    assert (answer["currency"], answer["has_cost"], answer["has_co2"]) == ("CHF", True, True)
    alice = next(row for row in answer["rows"] if row["label"] == "alice")
    assert (alice["cost"], alice["co2_kg"]) == (0.13, 0.168)
    assert answer["total"]["cost"] == 0.16  # and bob's 0.12 kWh
    csv_rows = list(
        csv.reader(
            io.StringIO(
                page_for(carol)
                .get("/reports/usage.csv", {"start": "2030-01-07", "end": "2030-01-07", "by": "user"})
                .content.decode()
            )
        )
    )
    assert csv_rows[1][-3:-1] == ["0.13", "0.168"]
