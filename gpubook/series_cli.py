"""Recurring bookings from the command line: ``gpubook book ... --repeat RRULE`` and ``gpubook series``.

``book --repeat`` posts to the series API (``--preview`` first to see the report, ``--skip-conflicts`` to
book around the refused occurrences); every occurrence's outcome is printed, one line each, and a refused
all-or-nothing series prints the same report on stderr before the portal's message. ``series`` lists your
series, shows one's occurrences, cancels it (all, or ``--from`` a day on) or books what came within reach.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TextIO

from gpubook.client import ApiError, Client
from gpubook.terminal import fmt_period, print_table

OUTCOMES = {
    "booked": "booked",
    "bookable": "can be booked",
    "refused": "refused",
    "later": "not booked yet",
    "held_back": "not booked (all or nothing)",
}


def add_repeat_options(book: argparse.ArgumentParser) -> None:
    repeat = book.add_argument_group("repeating (a series: each occurrence a booking of its own)")
    repeat.add_argument(
        "--repeat",
        metavar="RRULE",
        help='repeat the slot by an RFC 5545 rule with UNTIL or COUNT, e.g. "FREQ=WEEKLY;BYDAY=MO,TU,WE,TH,FR;'
        'UNTIL=20270331"',
    )
    repeat.add_argument(
        "--timezone", metavar="ZONE", help="the zone the wall time repeats in (default: your profile's)"
    )
    repeat.add_argument(
        "--skip-conflicts", action="store_true", help="book the other occurrences when some are refused"
    )
    repeat.add_argument("--preview", action="store_true", help="only show what booking the series would do")


def add_series_command(add: Callable[..., argparse.ArgumentParser], *, ident: Any) -> None:
    series = add("series", cmd_series, render_series_command, "your recurring bookings; one's occurrences")
    series.add_argument("id", type=ident, nargs="?", help="a series id: its occurrences")
    action = series.add_mutually_exclusive_group()
    action.add_argument("--cancel", action="store_true", help="cancel the series (with --from: from that day on)")
    action.add_argument("--book-now", action="store_true", help="book the occurrences now within reach")
    series.add_argument("--from", dest="from_day", metavar="YYYY-MM-DD", help="with --cancel: the first day to cancel")
    series.set_defaults(check=check_series_options)


def check_series_options(args: argparse.Namespace) -> None:
    """Wrong combinations are usage errors (argparse's: the usage, and exit status 2)."""
    if (args.cancel or args.book_now) and args.id is None:
        args.fail("--cancel and --book-now need a series id")
    if args.from_day is not None and not args.cancel:
        args.fail("--from goes with --cancel")


def cmd_series(client: Client, args: argparse.Namespace) -> Any:
    if args.id is None:
        return client.get_all("series/")
    if args.cancel:
        body = {"scope": "following", "from": args.from_day} if args.from_day else {"scope": "all"}
        return client.post(f"series/{args.id}/cancel/", body)
    if args.book_now:
        return client.post(f"series/{args.id}/book-within-reach/", {})
    return client.get(f"series/{args.id}/")


def render_series_command(result: Any) -> None:
    if isinstance(result, list):
        rows = [
            (s["id"], s["node"], s["start_time"], f"{s['duration_minutes']} min", s["timezone"], s["rule"])
            for s in result
        ]
        print_table(["ID", "NODE", "START", "LENGTH", "ZONE", "RULE"], rows)
    elif "report" in result:
        render_series(result)
    else:
        print(f"Series #{result['id']} ({result['rule']}, {result['timezone']}) on {result['node']}")
        occurrences = [
            (o["day"], fmt_period(o["start"], o["end"]), o["state"].replace("_", " "), o["reservation"] or "-")
            for o in result["occurrences"]
        ]
        print_table(["DAY", "WHEN", "STATE", "RESERVATION"], occurrences)


def check_repeat_options(args: argparse.Namespace) -> str | None:
    """What is wrong with the repeat options, or None."""
    if args.repeat is None and (args.skip_conflicts or args.preview or args.timezone):
        return "--skip-conflicts, --preview and --timezone go with --repeat"
    if args.repeat is not None and args.earliest:
        return "--earliest does not take --repeat (give --start)"
    return None


def book_series(client: Client, args: argparse.Namespace, body: dict[str, Any]) -> Any:
    series = {
        **body,
        "repeat": args.repeat,
        "mode": "skip" if args.skip_conflicts else "all",
        "preview": bool(args.preview),
    }
    if args.timezone:
        series["timezone"] = args.timezone
    try:
        return client.post("series/", series)
    except ApiError as exc:
        if exc.code == "series_conflict":
            print_report(exc.details, sys.stderr)
        raise


def with_series(render: Callable[[Any], None]) -> Callable[[Any], None]:
    """``book``'s renderer: a series' report for a series, else the booking as before."""

    def render_either(result: Any) -> None:
        if isinstance(result, dict) and "report" in result:
            render_series(result)
        else:
            render(result)

    return render_either


def render_series(result: dict[str, Any]) -> None:
    report, series = result["report"], result.get("series")
    if series:
        print(f"Series #{series['id']} ({series['rule']}, {series['timezone']})")
    elif report.get("preview"):
        print("Preview: nothing was booked.")
    print_report(report, sys.stdout)


def print_report(report: dict[str, Any], out: TextIO) -> None:
    for occurrence in report.get("occurrences", []):
        what = OUTCOMES.get(occurrence["outcome"], occurrence["outcome"])
        number = f" #{occurrence['reservation']}" if occurrence.get("reservation") else ""
        status = f" ({occurrence['status']})" if occurrence.get("status") == "pending" else ""
        line = f"  {fmt_period(occurrence['start'], occurrence['end'])}  {what}{number}{status}"
        if occurrence.get("message"):
            line += f": {occurrence['message']}"
        print(line, file=out)
    if report.get("summary"):
        print(report["summary"], file=out)
