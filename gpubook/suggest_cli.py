"""``gpubook suggest``: free slots near an asked one, ranked by past demand and energy price (the API's
/availability/suggest/). A booking refused because the slot is taken, or made in the week's busiest hours,
offers them too."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpubook.client import Client, ClientError
from gpubook.terminal import fmt_period, print_table

Add = Callable[..., argparse.ArgumentParser]
OFFERED = 3  # suggestions a refusal or a note lists


def add_suggest_command(add: Add, *, moment: Any, hours: Any, count: Any) -> None:
    """Register ``suggest`` with cli.py's ``add`` and argument types."""
    suggest = add("suggest", cmd_suggest, render_suggestions, "free slots near a start, quiet and cheap hours first")
    suggest.add_argument("--gpus", type=count, required=True, metavar="N", help="how many GPUs, on one node")
    suggest.add_argument("--hours", type=hours, required=True, metavar="H", help="for how long")
    suggest.add_argument("--start", type=moment, required=True, metavar="TIME", help="the start you would like")
    suggest.add_argument("--node", help="only this node")
    suggest.add_argument("--min-memory-gb", type=int, metavar="G", help="GPUs with at least this much memory")
    suggest.add_argument("--profile", metavar="P", help="MIG slices of this profile (e.g. 3g.40gb) instead of GPUs")


def cmd_suggest(client: Client, args: argparse.Namespace) -> Any:
    return ask(
        client,
        gpus=args.gpus,
        hours=args.hours,
        start=args.start,
        node=args.node,
        min_memory_gb=args.min_memory_gb,
        profile=args.profile,
    )


def ask(client: Client, *, start: datetime | str, **params: Any) -> Any:
    when = start if isinstance(start, str) else start.isoformat(timespec="seconds")
    return client.get("availability/suggest/", {**params, "start": when})


def render_suggestions(answer: dict[str, Any]) -> None:
    asked = answer["asked"]
    room = "free" if asked["free"] else "no room"
    print(f"Asked {fmt_period(asked['start'], asked['end'])}: {room}; {asked['why']}.")
    if not answer["suggestions"]:
        print("No free slot of that size nearby.")
        return
    rows = [_row(item) for item in answer["suggestions"]]
    currency = answer.get("currency", "")
    print_table(("NODE", "GPUS", "WHEN", "BOOKED THEN", "BUSIEST", f"{currency}/KWH"), rows)
    print(f"Ranked: {answer['ranking']}; from {answer['history_weeks']} past weeks.")


def _row(item: dict[str, Any]) -> tuple[str, ...]:
    price = item.get("price_per_kwh")
    return (
        item["node"],
        ",".join(str(index) for index in item["gpu_indexes"]),
        fmt_period(item["start"], item["end"]),
        f"{item['contention_pct']:.0f} %",
        f"{item['busiest_pct']:.0f} %" + (" (busy)" if item["busy"] else ""),
        "-" if price is None else str(price),
    )


def offered_lines(client: Client, *, only_if_busy: bool, question: dict[str, Any] | None) -> str | None:
    """A few free slots near a refused or busy booking (``question``: what to ask about it), as lines for stderr;
    None when there is nothing to say (a quiet slot, no suggestion) or the portal cannot answer (advice only:
    never an error of its own)."""
    if question is None:
        return None
    try:
        answer = ask(client, **question)
        if only_if_busy and not answer["asked"]["busy"]:
            return None
        slots = [
            f"  {item['node']} GPUs {','.join(map(str, item['gpu_indexes']))} {fmt_period(item['start'], item['end'])}"
            f" ({item['why']})"
            for item in answer["suggestions"][:OFFERED]
        ]
    except (ClientError, KeyError, TypeError, ValueError):
        return None
    if not slots:
        return None
    head = f"{answer['asked']['why']}; " if only_if_busy else ""
    return head + "free slots nearby (gpubook suggest for more):\n" + "\n".join(slots)
