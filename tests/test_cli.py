"""The ``gpubook`` command-line client, run as a real subprocess against a live portal.

The CLI talks HTTP only, so these tests use real times (the frozen ``clock`` cannot reach the
subprocess): bookings are made a day ahead, on the 15-minute grid.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from accounts.services import api_token_create
from reservations.models import Reservation
from reservations.services import reservation_create
from tests.factories import book, carve_mig, node_with_gpus

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parent.parent
UNREACHABLE = "http://127.0.0.1:9"


@dataclass
class Cli:
    """Runs ``python -m gpubook.cli`` with a clean environment: only what a test gives it."""

    url: str
    token: str | None
    config: Path
    env: dict[str, str] = field(default_factory=dict)

    def __call__(self, *args: object, **env: str) -> subprocess.CompletedProcess[str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUBOOK_")}
        environ.update(GPUBOOK_URL=self.url, GPUBOOK_CONFIG=str(self.config), **self.env, **env)
        if self.token is not None:
            environ["GPUBOOK_TOKEN"] = self.token
        return subprocess.run(  # noqa: S603 - our own interpreter and module
            [sys.executable, "-m", "gpubook.cli", *map(str, args)],
            capture_output=True,
            text=True,
            cwd=REPO,
            env=environ,
            timeout=60,
            check=False,
        )

    def json(self, *args: object) -> object:
        result = self(*args, "--json")
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def cli_for(live_server, tmp_path) -> Callable[..., Cli]:
    def make(user: object | None, url: str | None = None) -> Cli:
        token = api_token_create(user=user, name="cli")[1] if user is not None else None
        return Cli(url=url or live_server.url, token=token, config=tmp_path / "absent.ini")

    return make


@pytest.fixture
def start() -> datetime:
    """Tomorrow at 10:00 UTC: on the grid, and far enough from midnight that no slot a test books or is offered
    spans two days (the CLI writes such a slot with both dates, which the tests' expected lines do not)."""
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    return tomorrow.replace(hour=10, minute=0, second=0, microsecond=0)


def iso(moment: datetime) -> str:
    return moment.isoformat()


def parse(value: str) -> datetime:
    return datetime.fromisoformat(value)


def assert_clean_failure(result: subprocess.CompletedProcess[str], status: int) -> None:
    assert result.returncode == status, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


# --- gpus ----------------------------------------------------------------------------------------


def test_gpus_table_lists_the_four_gpus_with_their_holder(cli_for, alice, bob, gpus):
    now = datetime.now(UTC)
    reservation_create(user=bob, gpus=gpus[:1], start=now, end=now + timedelta(hours=1))
    result = cli_for(alice)("gpus")
    assert result.returncode == 0, result.stderr
    header, *rows = result.stdout.splitlines()
    assert header.split()[:5] == ["ID", "NODE", "GPU", "MODEL", "MEMORY"]
    assert len(rows) == 4
    assert all("gpu-a100" in row and "80 GiB" in row for row in rows)
    assert [row.split()[2] for row in rows] == ["0", "1", "2", "3"]
    assert "bob" in rows[0]
    assert "bob" not in "".join(rows[1:])


def test_gpus_json_follows_every_page(cli_for, alice, gpus):
    node_with_gpus(101, name="big-node")  # 105 GPUs: more than one page of 100
    listed = cli_for(alice).json("gpus")
    assert isinstance(listed, list)
    assert len(listed) == 105
    assert len({gpu["id"] for gpu in listed}) == 105


def test_gpus_filters_by_node(cli_for, alice, gpus):
    node_with_gpus(2, name="other")
    listed = cli_for(alice).json("gpus", "--node", "other")
    assert [gpu["node"] for gpu in listed] == ["other", "other"]


# --- book, mine ----------------------------------------------------------------------------------


def test_book_by_gpu_ids_then_mine_shows_it(cli_for, alice, gpus, start):
    cli = cli_for(alice)
    ids = f"{gpus[0].pk},{gpus[1].pk}"
    result = cli(
        "book", "--gpu-ids", ids, "--start", iso(start), "--end", iso(start + timedelta(hours=2)), "--purpose", "train"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Booked #")
    assert "gpu-a100" in result.stdout
    assert "GPUs 0,1" in result.stdout
    assert "approved" in result.stdout

    mine = cli.json("mine")
    assert len(mine) == 1
    booked = mine[0]
    assert (booked["node"], booked["status"], booked["purpose"]) == ("gpu-a100", "approved", "train")
    assert [gpu["index"] for gpu in booked["gpus"]] == [0, 1]
    assert parse(booked["start"]) == start
    assert parse(booked["end"]) == start + timedelta(hours=2)

    table = cli("mine")
    assert table.returncode == 0, table.stderr
    assert f"{booked['id']}" in table.stdout
    assert "train" in table.stdout


def test_book_json_prints_the_created_reservation(cli_for, alice, gpus, start):
    body = cli_for(alice).json("book", "--node", "gpu-a100", "--count", 3, "--start", iso(start), "--hours", 1.5)
    reservation = Reservation.objects.get()
    assert body["id"] == reservation.pk
    assert len(body["gpus"]) == 3
    assert parse(body["end"]) == start + timedelta(hours=1.5)


def test_times_without_an_offset_are_local_times(cli_for, alice, gpus, start):
    local_start = start.astimezone(UTC) - timedelta(hours=5)  # what a clock at UTC-5 shows
    naive = local_start.replace(tzinfo=None).isoformat(timespec="minutes")
    cli = cli_for(alice)
    cli.env["TZ"] = "EST+5"
    body = cli.json("book", "--gpu-ids", gpus[0].pk, "--start", naive, "--hours", 1)
    assert parse(body["start"]) == start


def test_a_conflicting_booking_fails_with_the_portals_message(cli_for, alice, bob, gpus, start):
    reservation_create(user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=2))
    result = cli_for(bob)("book", "--gpu-ids", gpus[0].pk, "--start", iso(start + timedelta(hours=1)), "--hours", 2)
    assert_clean_failure(result, 1)
    assert result.stderr.startswith("error: Slot taken: ")
    assert "alice" in result.stderr
    # Free slots nearby, then how to wait for this one.
    offered = result.stderr.split("free slots nearby (gpubook suggest for more):\n")[1].splitlines()
    assert len(offered) == 4 and offered.pop().startswith("to wait for it: gpubook wait --gpu-ids")
    assert offered[0].startswith(f"  gpu-a100 GPUs 1 {start + timedelta(hours=1):%Y-%m-%d %H:%M}–")  # same time
    assert all(line.startswith("  gpu-a100 GPUs ") and "% of GPUs booked on past" in line for line in offered)
    assert Reservation.objects.count() == 1


def test_booking_options_are_checked_before_asking(cli_for, alice, gpus):
    cli = cli_for(alice)
    assert_clean_failure(cli("book", "--gpu-ids", gpus[0].pk, "--hours", 1), 2)  # no --start
    assert_clean_failure(cli("book", "--count", 1, "--start", "now", "--hours", 1), 2)  # no --node
    assert_clean_failure(cli("book", "--earliest", "--gpus", 1), 2)  # no --hours
    assert_clean_failure(cli("book", "--gpu-ids", "x", "--start", "now", "--hours", 1), 2)
    assert_clean_failure(cli("book", "--gpu-ids", gpus[0].pk, "--start", "tomorrow", "--hours", 1), 2)
    assert not Reservation.objects.exists()


# --- times at the calendar's edge ----------------------------------------------------------------
# The portal takes times from 1970 to 2999 (UTC) and says so; the CLI passes its words on (exit 1)
# and never shows a traceback, even where its own arithmetic would overflow (exit 2).

EDGE = "outside the dates the portal takes: give a time from 1970-01-01 to 2999-12-31 (UTC)"


@pytest.mark.parametrize(
    "end", ["9999-12-31T23:59Z", "9999-12-31T23:59:59-23:59", "0001-01-01T00:00-05:00", "2030-01-07T12:00+23:59"]
)
def test_booking_at_the_calendars_edge_fails_with_the_portals_words(cli_for, alice, gpus, start, end):
    result = cli_for(alice)("book", "--gpu-ids", gpus[0].pk, "--start", iso(start), "--end", end)
    assert_clean_failure(result, 1)
    assert result.stderr.startswith("error: Invalid input — end: ")
    assert EDGE in result.stderr or "is no time zone's" in result.stderr
    assert not Reservation.objects.exists()


def test_extending_to_the_calendars_edge_fails_with_the_portals_words(cli_for, alice, gpus, start):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=1))
    result = cli_for(alice)("extend", reservation.pk, "--end", "9999-12-31T23:59:59Z")
    assert_clean_failure(result, 1)
    assert EDGE in result.stderr
    reservation.refresh_from_db()
    assert reservation.end == start + timedelta(hours=1)


def test_availability_after_the_calendars_edge_fails_with_the_portals_words(cli_for, alice, gpus):
    result = cli_for(alice)("available", "--gpus", 1, "--hours", 1, "--after", "9999-12-30T00:00Z")
    assert_clean_failure(result, 1)
    assert result.stderr.startswith("error: Invalid input — after: ")
    assert EDGE in result.stderr


@pytest.mark.parametrize(
    ("args", "words"),
    [
        # The end the CLI computes from --hours would pass the year 9999.
        (("--start", "9999-12-31T23:00Z", "--hours", 2), "plus 2 hours is past the year 9999"),
        (("--start", "now", "--hours", "1e12"), "plus 1e+12 hours is past the year 9999"),
        # A local time this close to the edge has no offset this machine can give it.
        (("--start", "9999-12-31T23:59", "--hours", 1), "too near the year 1 or 9999"),
        (("--start", "0001-01-01T00:00", "--hours", 1), "too near the year 1 or 9999"),
    ],
)
def test_times_the_cli_cannot_even_compute_are_usage_errors(cli_for, alice, gpus, args, words):
    cli = cli_for(alice)
    cli.env["TZ"] = "EST+5"  # west of UTC: 9999-12-31T23:59 local is in the year 10000 in UTC
    result = cli("book", "--gpu-ids", gpus[0].pk, *args)
    assert_clean_failure(result, 2)
    assert words in result.stderr
    assert not Reservation.objects.exists()


def test_extending_by_hours_past_the_year_9999_is_a_usage_error(cli_for, alice, gpus, start):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=1))
    result = cli_for(alice)("extend", reservation.pk, "--hours", "1e12")
    assert_clean_failure(result, 2)
    assert "plus 1e+12 hours is past the year 9999" in result.stderr


# --- extend, cancel, release ---------------------------------------------------------------------


def test_extend_by_hours_and_to_an_end(cli_for, alice, gpus, start):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=1))
    cli = cli_for(alice)

    result = cli("extend", reservation.pk, "--hours", 1)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Extended #{reservation.pk}")
    reservation.refresh_from_db()
    assert reservation.end == start + timedelta(hours=2)

    body = cli.json("extend", reservation.pk, "--end", iso(start + timedelta(hours=3)))
    assert parse(body["end"]) == start + timedelta(hours=3)


def test_an_extension_that_needs_approval_says_it_waits(cli_for, alice, carol, gpus, start):
    node = gpus[0].node
    node.requires_approval = True
    node.save()
    reservation = reservation_create(
        user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=1), actor=carol
    )

    result = cli_for(alice)("extend", reservation.pk, "--hours", 2)

    assert result.returncode == 0, result.stderr
    waiting = Reservation.objects.get(extends=reservation)
    assert result.stdout.splitlines()[0].startswith("Extension until ")
    assert f"requested (#{waiting.pk}) for" in result.stdout
    assert "It waits for an admin's approval" in result.stdout
    reservation.refresh_from_db()
    assert reservation.end == start + timedelta(hours=1)


def test_cancel_with_a_reason(cli_for, alice, gpus, start):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=1))
    result = cli_for(alice)("cancel", reservation.pk, "--reason", "plans changed")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Cancelled #{reservation.pk}")
    reservation.refresh_from_db()
    assert (reservation.status, reservation.cancel_reason) == ("cancelled", "plans changed")


def test_book_now_then_release(cli_for, alice, gpus):
    cli = cli_for(alice)
    booked = cli.json("book", "--node", "gpu-a100", "--count", 1, "--start", "now", "--hours", 1)
    assert booked["phase"] == "running"
    result = cli("release", booked["id"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Released #{booked['id']}")
    assert Reservation.objects.get().released_at is not None


def test_someone_elses_reservation_is_not_found(cli_for, alice, bob, gpus, start):
    reservation = reservation_create(user=alice, gpus=gpus[:1], start=start, end=start + timedelta(hours=1))
    result = cli_for(bob)("cancel", reservation.pk)
    assert_clean_failure(result, 1)
    assert result.stderr.startswith("error: ")
    reservation.refresh_from_db()
    assert reservation.status == "approved"


# --- me, configuration, failures -----------------------------------------------------------------


def test_me(cli_for, alice):
    cli = cli_for(alice)
    assert cli.json("me")["username"] == "alice"
    result = cli("me")
    assert result.returncode == 0, result.stderr
    assert "alice" in result.stdout


def test_config_file_and_env_wins(cli_for, alice, tmp_path):
    cli = cli_for(alice)
    config = tmp_path / "config.ini"
    config.write_text(f"[gpubook]\nurl = {cli.url}\ntoken = {cli.token}\n")
    from_file = Cli(url="", token=None, config=config)
    assert from_file.json("me")["username"] == "alice"

    config.write_text(f"[gpubook]\nurl = {UNREACHABLE}\ntoken = gpb_wrong\n")
    env_wins = Cli(url=cli.url, token=cli.token, config=config)
    assert env_wins.json("me")["username"] == "alice"


def test_a_bad_token_fails_with_the_auth_message(cli_for, alice, gpus):
    cli = cli_for(alice)
    cli.token = "gpb_not-a-real-token"
    result = cli("gpus")
    assert_clean_failure(result, 1)
    assert result.stderr.strip() == "error: Unknown or revoked API token."


def test_no_token_is_a_configuration_error(cli_for):
    result = cli_for(None)("me")
    assert_clean_failure(result, 2)
    assert "GPUBOOK_TOKEN" in result.stderr


def test_an_unreachable_portal_exits_3_naming_the_url(cli_for, alice):
    result = cli_for(alice, url=UNREACHABLE)("mine")
    assert_clean_failure(result, 3)
    assert UNREACHABLE in result.stderr


# --- availability (the endpoint may not exist yet) -----------------------------------------------


def availability_exists(cli: Cli) -> bool:
    request = urllib.request.Request(  # noqa: S310 - the live test server
        f"{cli.url}/api/v1/availability/?gpus=1&hours=1", headers={"Authorization": f"Bearer {cli.token}"}
    )
    try:
        urllib.request.urlopen(request, timeout=10).close()  # noqa: S310 - the live test server
    except urllib.error.HTTPError as exc:
        return exc.code != 404
    return True


def test_available_and_book_earliest(cli_for, alice, bob, gpus, start):
    cli = cli_for(alice)
    if not availability_exists(cli):
        pytest.skip("/api/v1/availability/ is not there yet")
    reservation_create(user=bob, gpus=gpus, start=start, end=start + timedelta(hours=2))

    windows = cli.json("available", "--gpus", 2, "--hours", 1, "--node", "gpu-a100", "--after", iso(start))
    assert windows, "expected a window"
    first = windows[0]
    assert first["node"] == "gpu-a100"
    assert len(first["gpus"]) == len(first["gpu_indexes"]) == 2
    assert parse(first["start"]) >= start + timedelta(hours=2)

    table = cli("available", "--gpus", 2, "--hours", 1)
    assert table.returncode == 0, table.stderr
    assert "gpu-a100" in table.stdout

    booked = cli.json("book", "--earliest", "--gpus", 2, "--hours", 1, "--node", "gpu-a100", "--purpose", "asap")
    assert (booked["node"], len(booked["gpus"]), booked["purpose"]) == ("gpu-a100", 2, "asap")
    assert parse(booked["end"]) - parse(booked["start"]) >= timedelta(hours=1)


def test_the_client_imports_nothing_of_the_project():
    project = {"django", "rest_framework", "portal", "accounts", "audit", "nodes", "reservations"}
    code = "import sys, gpubook.cli; print('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run(  # noqa: S603 - our own interpreter
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True, timeout=60
    )
    assert project.isdisjoint(name.split(".")[0] for name in result.stdout.split())


def test_mig_slices_are_listed_found_and_booked_by_profile(cli_for, alice, gpus, start):
    slices = carve_mig(gpus[0])
    cli = cli_for(alice)
    listed = cli("gpus", "--node", "gpu-a100")
    assert listed.returncode == 0, listed.stderr
    assert "0 3g.40gb" in listed.stdout and "0 2g.20gb" in listed.stdout

    windows = cli.json("available", "--gpus", 2, "--hours", 1, "--profile", "2g.20gb", "--after", iso(start))
    assert windows[0]["gpus"] == [slices[1].pk, slices[2].pk]

    booked = cli.json(
        "book", "--count", 1, "--node", "gpu-a100", "--profile", "3g.40gb", "--start", iso(start), "--hours", 1
    )
    assert [gpu["id"] for gpu in booked["gpus"]] == [slices[0].pk]
    refused = cli("book", "--gpu-ids", str(slices[1].pk), "--profile", "2g.20gb", "--start", iso(start), "--hours", 1)
    assert refused.returncode != 0 and "--gpu-ids does not take --profile" in refused.stderr


# --- series (book --repeat) ----------------------------------------------------------------------


def test_book_repeat_previews_then_books_a_series_and_prints_each_occurrence(cli_for, alice, bob, gpus, start):
    reservation_create(user=bob, gpus=gpus[:1], start=start + timedelta(days=1), end=start + timedelta(days=1, hours=1))
    cli = cli_for(alice)
    args = ("book", "--gpu-ids", gpus[0].pk, "--start", iso(start), "--hours", 1, "--repeat", "FREQ=DAILY;COUNT=3")
    preview = cli(*args, "--timezone", "UTC", "--preview")
    assert preview.returncode == 0, preview.stderr
    lines = preview.stdout.splitlines()
    assert lines[0] == "Preview: nothing was booked."
    assert "can be booked" in lines[1] and "refused: Slot taken:" in lines[2] and "bob" in lines[2]
    assert lines[-1] == "2 of 3 occurrences can be booked, 1 refused."
    assert not Reservation.objects.filter(user=alice).exists()

    refused = cli(*args, "--timezone", "UTC")
    assert refused.returncode == 1
    assert "not booked (all or nothing)" in refused.stderr
    assert "error: 1 of 3 occurrences cannot be booked, so none was (all or nothing)" in refused.stderr

    booked = cli(*args, "--timezone", "UTC", "--skip-conflicts")
    assert booked.returncode == 0, booked.stderr
    assert booked.stdout.startswith("Series #") and "FREQ=DAILY;COUNT=3, UTC" in booked.stdout
    assert booked.stdout.count(" booked #") == 2
    assert Reservation.objects.filter(user=alice, series__isnull=False).count() == 2


def test_repeat_options_without_repeat_are_usage_errors(cli_for, alice, gpus, start):
    result = cli_for(alice)("book", "--gpu-ids", gpus[0].pk, "--start", iso(start), "--hours", 1, "--preview")
    assert result.returncode == 2
    assert "--skip-conflicts, --preview and --timezone go with --repeat" in result.stderr


def test_a_bad_repeat_rule_fails_with_the_portals_words(cli_for, alice, gpus, start):
    result = cli_for(alice)(
        "book", "--gpu-ids", gpus[0].pk, "--start", iso(start), "--hours", 1, "--repeat", "FREQ=DAILY"
    )
    assert_clean_failure(result, 1)
    assert "The repeat rule must end: add UNTIL=YYYYMMDD" in result.stderr


def test_series_lists_shows_books_within_reach_and_cancels(cli_for, alice, gpus, start):
    cli = cli_for(alice)
    made = cli.json(
        "book",
        "--gpu-ids",
        gpus[0].pk,
        "--start",
        iso(start),
        "--hours",
        1,
        "--repeat",
        "FREQ=DAILY;COUNT=3",
        "--timezone",
        "UTC",
    )
    series_id = made["series"]["id"]
    listing = cli("series")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[0].split() == ["ID", "NODE", "START", "LENGTH", "ZONE", "RULE"]
    assert "FREQ=DAILY;COUNT=3" in listing.stdout and "60 min" in listing.stdout

    shown = cli("series", series_id)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("approved") == 3

    nothing = cli("series", series_id, "--book-now")
    assert nothing.returncode == 0, nothing.stderr
    assert "Nothing to book" in nothing.stdout

    day = (start + timedelta(days=1)).date().isoformat()
    cancelled = cli("series", series_id, "--cancel", "--from", day)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.count("cancelled") == 2 and cancelled.stdout.count("approved") == 1
    assert Reservation.objects.filter(series_id=series_id, status="approved").count() == 1

    misuse = cli("series", "--cancel")
    assert misuse.returncode == 2 and "--cancel and --book-now need a series id" in misuse.stderr


def test_a_booking_far_longer_than_the_persons_history_gets_a_note(cli_for, alice, gpus, start):
    from tests.accounting.test_length_advice import past_booking

    for days in (2, 3, 4):
        past_booking(alice, gpus[:1], days, 6, 60)  # busy an hour of each 6-hour booking
    result = cli_for(alice)("book", "--gpu-ids", gpus[0].pk, "--start", iso(start), "--hours", 8)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("Booked #")
    assert "note: Your last 3 one-GPU bookings were busy 1.0 h on average (booked 6.0 h)" in result.stderr
    quiet = cli_for(alice)("book", "--gpu-ids", gpus[1].pk, "--start", iso(start), "--hours", 1.5)
    assert quiet.returncode == 0 and "note:" not in quiet.stderr


def test_suggest_lists_free_slots_and_a_booking_in_the_busiest_hours_offers_them(cli_for, alice, bob, gpus, start):
    start = start.replace(minute=0)  # whole hours of the week, so the figures are round
    for week in range(1, 9):  # every past week, the whole fleet booked at this hour
        past = start - timedelta(weeks=week)
        book(bob, gpus, past, past + timedelta(hours=2), direct=True)
    cli = cli_for(alice)

    listed = cli("suggest", "--gpus", 2, "--hours", 2, "--start", iso(start))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].endswith(
        "free; busy hour: 100 % of GPUs booked on past " + f"{start:%A}s at {start:%H}:00; 100 % over the slot."
    )
    assert lines[1].split() == ["NODE", "GPUS", "WHEN", "BOOKED", "THEN", "BUSIEST", "EUR/KWH"]
    assert lines[2].split()[:2] == ["gpu-a100", "0,1"] and " 0 % " in lines[2]
    assert lines[-1].startswith("Ranked: quiet hours before the busiest quarter")

    booked = cli("book", "--gpu-ids", gpus[0].pk, "--start", iso(start), "--hours", 1)
    assert booked.returncode == 0, booked.stderr
    assert "note: busy hour: 100 % of GPUs booked" in booked.stderr
    assert "free slots nearby (gpubook suggest for more):\n  gpu-a100 GPUs 0 " in booked.stderr
