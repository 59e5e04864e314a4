"""A recurring booking in the feeds: each occurrence is an event of its own that the independent parser
(vobject) reads, at the series' wall time on both sides of a DST change, and a cancelled occurrence is a
cancelled event."""

from __future__ import annotations

from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from reservations.series import series_create
from reservations.services import reservation_cancel
from tests.factories import UserFactory

from .conftest import event_of, events, instant, read_feed, text

pytestmark = pytest.mark.usefixtures("clock")


def test_each_occurrence_is_its_own_event_at_the_wall_time_across_dst(gpus):
    ny = ZoneInfo("America/New_York")
    nina = UserFactory(username="nina", timezone="America/New_York")
    report = series_create(
        user=nina,
        gpus=gpus[:1],
        start=datetime(2030, 3, 4, 9, tzinfo=ny),
        end=datetime(2030, 3, 4, 11, tzinfo=ny),
        rule="FREQ=WEEKLY;BYDAY=MO;COUNT=3",
        zone="America/New_York",
    )
    occurrences = [o.reservation for o in report.occurrences]
    reservation_cancel(reservation=occurrences[2], actor=nina)

    calendar = read_feed(nina)

    assert set(events(calendar)) == {f"reservation-{r.pk}@testserver" for r in occurrences}
    # 09:00 in New York: 14:00 UTC before the change on 10 March, 13:00 after.
    assert [instant(event_of(calendar, r), "dtstart") for r in occurrences] == [
        datetime(2030, 3, 4, 14, tzinfo=UTC),
        datetime(2030, 3, 11, 13, tzinfo=UTC),
        datetime(2030, 3, 18, 13, tzinfo=UTC),
    ]
    assert text(event_of(calendar, occurrences[2]), "status") == "CANCELLED"
    assert text(event_of(calendar, occurrences[0]), "status") == "CONFIRMED"
    assert f"One occurrence of recurring booking (series) #{report.series.pk}." in text(
        event_of(calendar, occurrences[1]), "description"
    )
