"""``gpubook``: book the portal's GPUs from a terminal, over the REST API only.

Configuration comes from GPUBOOK_URL and GPUBOOK_TOKEN, or from the ``[gpubook]`` section (``url``,
``token``) of ~/.config/gpubook/config.ini (or the file GPUBOOK_CONFIG names); the environment wins.

Times given without an offset are local times of this machine and are sent with its offset.
Exit status: 0 done, 1 the portal refused (its message goes to stderr), 2 bad usage or
configuration, 3 the portal could not be reached.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpubook import __version__
from gpubook.client import ApiError, Client, ClientError, ConfigError, Unreachable, load_config
from gpubook.launch_cli import add_launch_commands, environment_id, launch_with_booking
from gpubook.series_cli import (
    add_repeat_options,
    add_series_command,
    book_series,
    check_repeat_options,
    with_series,
)
from gpubook.suggest_cli import add_suggest_command, offered_lines
from gpubook.terminal import fmt_moment, fmt_period, print_table
from gpubook.waitlist_cli import add_waitlist_commands, waitlist_hint

EXIT_API_ERROR = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
TIME_EXAMPLE = "like 2026-12-03T14:00, 2026-12-03T14:00+01:00 or now"

Handler = Callable[[Client, argparse.Namespace], Any]
Renderer = Callable[[Any], None]


class UsageError(Exception):
    """A combination of options argparse cannot check by itself."""


# --- argument types ------------------------------------------------------------------------------


def parse_moment(text: str) -> datetime:
    """An ISO 8601 time or ``now``; a time without an offset is taken as local time."""
    text = text.strip()
    if text.lower() == "now":
        return datetime.now().astimezone().replace(microsecond=0)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r} ({TIME_EXAMPLE})") from None
    if moment.tzinfo is not None:
        return moment
    try:
        return moment.astimezone()
    except (OverflowError, ValueError, OSError):  # this machine's offset pushes it past year 1 or 9999
        raise argparse.ArgumentTypeError(f"too near the year 1 or 9999 to read as a local time: {text!r}") from None


def add_hours(moment: datetime, hours: float) -> datetime:
    """``moment`` plus ``hours``; the calendar's end (year 9999) is a usage error, not a traceback.
    Whether the portal takes the time is the portal's to say (it answers in words)."""
    try:
        return moment + timedelta(hours=hours)
    except OverflowError:
        raise UsageError(f"{moment.isoformat()} plus {hours:g} hours is past the year 9999") from None


def positive_hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of hours: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"hours must be more than 0, not {text!r}")
    return value


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, not {text!r}")
    return value


def id_list(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("give GPU ids separated by commas, like 1,2")
    return [positive_int(part) for part in parts]


def iso(moment: datetime) -> str:
    return moment.isoformat()


# --- output --------------------------------------------------------------------------------------


def gpu_indexes(reservation: dict[str, Any]) -> str:
    return ",".join(str(gpu["index"]) for gpu in reservation.get("gpus", []))


def describe_reservation(reservation: dict[str, Any]) -> str:
    when = fmt_period(reservation["start"], reservation["end"])
    return (
        f"#{reservation['id']}  {reservation['node']}  GPUs {gpu_indexes(reservation)}  {when}  {reservation['status']}"
    )


def render_gpus(gpus: list[dict[str, Any]]) -> None:
    if not gpus:
        print("No GPUs match.")
        return
    rows = [
        (
            gpu["id"],
            gpu["node"],
            f"{gpu['index']} {gpu['profile']}" if gpu.get("profile") else gpu["index"],
            gpu["model"],
            f"{gpu['memory_mib'] / 1024:.0f} GiB",
            "yes" if gpu["bookable"] else "no",
            gpu["current"]["user"] if gpu.get("current") else "-",
            fmt_moment(gpu["current"]["end"]) if gpu.get("current") else "-",
            _next_booking(gpu.get("next")),
        )
        for gpu in gpus
    ]
    print_table(("ID", "NODE", "GPU", "MODEL", "MEMORY", "BOOKABLE", "HELD BY", "UNTIL", "NEXT"), rows)


def _next_booking(slot: dict[str, Any] | None) -> str:
    if not slot:
        return "-"
    return f"{slot['user']} {fmt_period(slot['start'], slot['end'])}"


def render_windows(windows: list[dict[str, Any]]) -> None:
    if not windows:
        print("No free window found.")
        return
    rows = [
        (window["node"], ",".join(str(i) for i in window["gpu_indexes"]), fmt_period(window["start"], window["end"]))
        for window in windows
    ]
    print_table(("NODE", "GPUS", "WHEN"), rows)


def render_reservations(reservations: list[dict[str, Any]]) -> None:
    if not reservations:
        print("No reservations.")
        return
    rows = [
        (
            r["id"],
            r["node"],
            gpu_indexes(r),
            fmt_period(r["start"], r["end"]),
            r["status"],
            r["phase"],
            r.get("purpose") or "",
        )
        for r in reservations
    ]
    print_table(("ID", "NODE", "GPUS", "WHEN", "STATUS", "PHASE", "PURPOSE"), rows)


def reservation_renderer(verb: str) -> Renderer:
    def render(reservation: dict[str, Any]) -> None:
        waiting = reservation.get("pending_extension")
        if verb == "Extended" and waiting:
            print(f"Extension until {fmt_moment(waiting['end'])} requested (#{waiting['id']}) for")
            print(f"  {describe_reservation(reservation)}")
            print("It waits for an admin's approval: the time is held, and the booking keeps its end meanwhile.")
            return
        print(f"{verb} {describe_reservation(reservation)}")
        if reservation["status"] == "pending":
            print("Waiting for an admin's approval: the slot is held meanwhile.")

    return render


def render_me(me: dict[str, Any]) -> None:
    lines = [
        ("user", f"{me['username']} (unix account {me.get('unix_username') or '-'})"),
        ("email", me.get("email") or "-"),
        ("admin", "yes" if me.get("is_admin") else "no"),
        ("needs approval", "yes" if me.get("requires_approval") else "no"),
        ("GPUs at once", _usage(me.get("gpus_at_once"))),
        ("GPU hours this week", _usage(me.get("weekly_gpu_hours"))),
        ("longest slot (hours)", _number(me.get("max_slot_hours"))),
        ("days ahead", _number(me.get("max_days_ahead"))),
    ]
    width = max(len(name) for name, _ in lines)
    for name, value in lines:
        print(f"{name.ljust(width)}  {value}")


def _number(value: Any) -> str:
    if value is None:
        return "no limit"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _usage(usage: dict[str, Any] | None) -> str:
    if not usage:
        return "-"
    return f"{_number(usage.get('used'))} used of {_number(usage.get('allowed'))}"


def print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


# --- commands ------------------------------------------------------------------------------------


def cmd_gpus(client: Client, args: argparse.Namespace) -> Any:
    params = {"node": args.node, "model": args.model, "min_memory_gb": args.min_memory_gb}
    return client.get_all("gpus/", params)


def cmd_available(client: Client, args: argparse.Namespace) -> Any:
    return find_windows(client, args)


def find_windows(client: Client, args: argparse.Namespace) -> list[dict[str, Any]]:
    params = {
        "gpus": args.gpus,
        "hours": f"{args.hours:g}",
        "node": args.node,
        "min_memory_gb": args.min_memory_gb,
        "after": iso(args.after) if args.after else None,
        "profile": args.profile,
    }
    return client.get_all("availability/", params)


def cmd_book(client: Client, args: argparse.Namespace) -> Any:
    if args.earliest:
        body = earliest_booking(client, args)
    else:
        end = args.end or add_hours(args.start, args.hours)
        target = {"gpus": args.gpu_ids} if args.gpu_ids else {"node": args.node, "gpu_count": args.count}
        if args.profile:
            target["profile"] = args.profile
        body = {**target, "start": iso(args.start), "end": iso(end)}
    if args.repeat is not None:
        return book_series(client, args, {**body, "purpose": args.purpose})
    environment = environment_id(client, args.launch) if args.launch else None  # unknown: refused before booking
    try:
        reservation = client.post("reservations/", {**body, "purpose": args.purpose})
    except ApiError as refused:
        if refused.code in WAITABLE:
            refused.hints.append(offered_lines(client, only_if_busy=False, question=_question(client, body)))
        raise
    booked = {**reservation, "gpus": [gpu["id"] for gpu in reservation.get("gpus", ())]}
    for note in (
        launch_with_booking(client, reservation, environment) if environment else None,
        length_note(client, reservation),
        offered_lines(client, only_if_busy=True, question=_question(client, booked)),
    ):
        if note:
            print(f"note: {note}", file=sys.stderr)
    return reservation


WAITABLE = ("slot_conflict", "reserved")  # refusals for a taken slot: wait for it, or take another


def _question(client: Client, booking: dict[str, Any]) -> dict[str, Any] | None:
    """What to ask /availability/suggest/ about a booking (or a booking's body, GPUs by id or by count): how
    many GPUs, or MIG slices of which profile, from when, how long. None when the portal cannot say."""
    try:
        hours = _hours(booking)
        profile = booking.get("profile")
        ids = booking.get("gpus") or []
        if profile is None and ids:  # GPUs by id: cards, or slices of the first one's profile
            profile = client.get(f"gpus/{ids[0]}/").get("profile") or None
        gpus = booking.get("gpu_count") or len(ids)
    except (ClientError, AttributeError, KeyError, TypeError, ValueError):
        return None
    return {"gpus": gpus, "hours": hours, "start": booking["start"], "profile": profile}


def _hours(booking: dict[str, Any]) -> float:
    """How long a booking (or a booking's body) is, in hours to the hundredth, as the advice endpoints take it."""
    return round((parse_iso(booking["end"]) - parse_iso(booking["start"])).total_seconds() / 3600, 2)


def length_note(client: Client, reservation: dict[str, Any]) -> str | None:
    """The portal's advice when a booking is far longer than the person's own bookings of as many GPUs were busy
    (me/length-advice/). Advice only: a portal without it, or any failure, says nothing."""
    try:
        answer = client.get("me/length-advice/", {"gpus": len(reservation["gpus"]), "hours": _hours(reservation)})
        return answer.get("advice") if isinstance(answer, dict) else None
    except (ClientError, KeyError, TypeError, ValueError):
        return None


def parse_iso(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def earliest_booking(client: Client, args: argparse.Namespace) -> dict[str, Any]:
    windows = find_windows(client, args)
    units = f"{args.profile} slices" if args.profile else "GPUs"
    if not windows:
        where = f" on {args.node}" if args.node else ""
        raise ClientError(f"no window with {args.gpus} free {units} for {args.hours:g} hours{where}.")
    first = windows[0]
    body = {"node": first["node"], "gpu_count": args.gpus, "start": first["start"], "end": first["end"]}
    return body | ({"profile": args.profile} if args.profile else {})


def check_book_options(args: argparse.Namespace) -> None:
    """The three ways to book each take their own options; say which one is off."""
    repeat_problem = check_repeat_options(args)
    if repeat_problem:
        raise UsageError(repeat_problem)
    if args.launch and args.repeat is not None:
        raise UsageError("--launch books one slot: launch in a series' bookings one by one (gpubook launch)")
    if args.earliest:
        _require(args, "--earliest", gpus="--gpus", hours="--hours")
        _forbid(args, "--earliest", start="--start (use --after)", end="--end")
        return
    mode = "--count" if args.count else "--gpu-ids"
    _require(args, mode, start="--start")
    if (args.end is None) == (args.hours is None):
        raise UsageError(f"{mode} needs one of --end or --hours")
    _forbid(args, mode, gpus="--gpus", min_memory_gb="--min-memory-gb", after="--after")
    if args.count:
        _require(args, mode, node="--node")
    else:
        _forbid(args, mode, node="--node", profile="--profile (give slice ids)")


def _require(args: argparse.Namespace, mode: str, **options: str) -> None:
    missing = [flag for name, flag in options.items() if getattr(args, name) is None]
    if missing:
        raise UsageError(f"{mode} needs {' and '.join(missing)}")


def _forbid(args: argparse.Namespace, mode: str, **options: str) -> None:
    extra = [flag for name, flag in options.items() if getattr(args, name) is not None]
    if extra:
        raise UsageError(f"{mode} does not take {', '.join(extra)}")


def cmd_mine(client: Client, args: argparse.Namespace) -> Any:
    after = iso(datetime.now().astimezone()) if args.upcoming else None
    return client.get_all("reservations/", {"mine": True, "after": after})


def cmd_cancel(client: Client, args: argparse.Namespace) -> Any:
    body = {"reason": args.reason} if args.reason is not None else {}
    return client.post(f"reservations/{args.id}/cancel/", body)


def cmd_release(client: Client, args: argparse.Namespace) -> Any:
    return client.post(f"reservations/{args.id}/release/", {})


def cmd_extend(client: Client, args: argparse.Namespace) -> Any:
    if args.end is not None:
        end = args.end
    else:
        current = client.get(f"reservations/{args.id}/")
        end = add_hours(datetime.fromisoformat(current["end"]), args.hours)
    return client.post(f"reservations/{args.id}/extend/", {"end": iso(end)})


def cmd_me(client: Client, args: argparse.Namespace) -> Any:
    return client.get("me/")


# --- parser --------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpubook",
        description="Book the lab's GPUs from the command line.",
        epilog="Set GPUBOOK_URL and GPUBOOK_TOKEN, or url and token under [gpubook] in "
        "~/.config/gpubook/config.ini (GPUBOOK_CONFIG names another file).",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("--json", action="store_true", help="print the API's JSON instead of a table")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add = _adder(commands, common)
    _add_gpus(add)
    _add_available(add)
    _add_book(add)
    add("mine", cmd_mine, render_reservations, "your reservations").add_argument(
        "--upcoming", action="store_true", help="only those not over yet"
    )
    cancel = add("cancel", cmd_cancel, reservation_renderer("Cancelled"), "cancel a reservation before it starts")
    cancel.add_argument("id", type=positive_int, help="reservation id")
    cancel.add_argument("--reason", help="why (shown to admins)")
    release = add("release", cmd_release, reservation_renderer("Released"), "end a running reservation now")
    release.add_argument("id", type=positive_int, help="reservation id")
    _add_extend(add)
    add("me", cmd_me, render_me, "who you are, your limits and their use")
    add_series_command(add, ident=positive_int)
    add_waitlist_commands(add, moment=parse_moment, hours=positive_hours, ids=id_list, count=positive_int)
    add_suggest_command(add, moment=parse_moment, hours=positive_hours, count=positive_int)
    add_launch_commands(add, ident=positive_int)
    return parser


def _adder(
    commands: argparse._SubParsersAction, common: argparse.ArgumentParser
) -> Callable[[str, Handler, Renderer, str], argparse.ArgumentParser]:
    def add(name: str, handler: Handler, renderer: Renderer, help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, parents=[common], help=help_text, description=help_text, allow_abbrev=False)
        sub.set_defaults(handler=handler, renderer=renderer, fail=sub.error, check=None)
        return sub

    return add


def _add_gpus(add: Callable[..., argparse.ArgumentParser]) -> None:
    gpus = add("gpus", cmd_gpus, render_gpus, "GPUs with their current holder and next booking")
    gpus.add_argument("--node", help="node name")
    gpus.add_argument("--model", help="part of the model name, e.g. A100")
    gpus.add_argument("--min-memory-gb", type=int, metavar="G", help="at least this much memory")


def _add_search_options(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("--gpus", type=positive_int, required=required, metavar="N", help="how many GPUs, on one node")
    parser.add_argument("--hours", type=positive_hours, required=required, metavar="H", help="for how long")
    parser.add_argument("--node", help="only this node (with --count: the node to book on)")
    parser.add_argument("--min-memory-gb", type=int, metavar="G", help="GPUs with at least this much memory")
    parser.add_argument("--after", type=parse_moment, metavar="TIME", help=f"not before this time ({TIME_EXAMPLE})")
    parser.add_argument("--profile", metavar="P", help="MIG slices of this profile (e.g. 3g.40gb) instead of GPUs")


def _add_available(add: Callable[..., argparse.ArgumentParser]) -> None:
    available = add("available", cmd_available, render_windows, "the earliest free windows")
    _add_search_options(available, required=True)


def _add_book(add: Callable[..., argparse.ArgumentParser]) -> None:
    book = add("book", cmd_book, with_series(reservation_renderer("Booked")), "book GPUs (--repeat: a series)")
    book.set_defaults(check=check_book_options)
    mode = book.add_mutually_exclusive_group(required=True)
    mode.add_argument("--earliest", action="store_true", help="the earliest window for --gpus N --hours H")
    mode.add_argument("--count", type=positive_int, metavar="N", help="N GPUs of --node, picked by the portal")
    mode.add_argument("--gpu-ids", type=id_list, metavar="IDS", help="these GPU ids, like 1,2")
    _add_search_options(book, required=False)
    book.add_argument("--start", type=parse_moment, metavar="TIME", help=f"start ({TIME_EXAMPLE})")
    book.add_argument("--end", type=parse_moment, metavar="TIME", help="end (or give --hours)")
    book.add_argument("--purpose", default="", help="what the GPUs are for")
    book.add_argument("--launch", metavar="ENV", help="run this environment (id or name) in the booking from its start")
    add_repeat_options(book)


def _add_extend(add: Callable[..., argparse.ArgumentParser]) -> None:
    extend = add("extend", cmd_extend, reservation_renderer("Extended"), "move a reservation's end later")
    extend.add_argument("id", type=positive_int, help="reservation id")
    until = extend.add_mutually_exclusive_group(required=True)
    until.add_argument("--end", type=parse_moment, metavar="TIME", help=f"the new end ({TIME_EXAMPLE})")
    until.add_argument("--hours", type=positive_hours, metavar="H", help="add H hours to the current end")


# --- entry point ---------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    config = load_config()
    if not config.token:
        raise ConfigError(f"no API token: set GPUBOOK_TOKEN, or token under [gpubook] in {config.source}.")
    result = args.handler(Client(config), args)
    if args.json:
        print_json(result)
    else:
        args.renderer(result)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.check is not None:
        try:
            args.check(args)
        except UsageError as exc:
            args.fail(str(exc))  # prints the usage and exits with status 2
    try:
        return run(args)
    except (ConfigError, UsageError) as exc:
        return _fail(str(exc), EXIT_USAGE)
    except Unreachable as exc:
        return _fail(str(exc), EXIT_UNREACHABLE)
    except ApiError as exc:
        waitable = exc.code in WAITABLE and args.command == "book"
        hints = [*exc.hints, waitlist_hint(args)] if waitable else exc.hints
        return _fail("\n".join([str(exc), *filter(None, hints)]), EXIT_API_ERROR)
    except ClientError as exc:
        return _fail(str(exc), EXIT_API_ERROR)
    except KeyboardInterrupt:
        return 130


def _fail(message: str, status: int) -> int:
    print(f"error: {message}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
