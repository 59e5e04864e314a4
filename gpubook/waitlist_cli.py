"""``gpubook wait``, ``waitlist``, ``claim``, ``decline``, ``leave``: the waitlist from a terminal (the API's
/waitlist/ endpoints). A booking refused because the slot is taken says how to wait for it instead."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpubook.client import Client
from gpubook.terminal import fmt_moment, fmt_period, print_table

Add = Callable[..., argparse.ArgumentParser]


def add_waitlist_commands(add: Add, *, moment: Any, hours: Any, ids: Any, count: Any) -> None:
    """Register the commands with cli.py's ``add`` and argument types (``moment``, ``hours``, ``ids``, ``count``)."""
    wait = add("wait", cmd_wait, render_entry("Joined the waitlist:"), "wait for GPUs that are taken")
    target = wait.add_mutually_exclusive_group(required=True)
    target.add_argument("--gpu-ids", type=ids, metavar="IDS", help="these GPU ids, like 1,2")
    target.add_argument("--node", help="any --count GPUs of this node")
    target.add_argument("--model", help="any --count GPUs of this model, on one node")
    wait.add_argument("--count", type=count, default=1, metavar="N", help="how many (with --node or --model)")
    wait.add_argument("--profile", metavar="P", help="MIG slices of this profile (with --node)")
    wait.add_argument("--from", dest="earliest", type=moment, required=True, metavar="TIME", help="not before")
    wait.add_argument("--until", dest="latest", type=moment, required=True, metavar="TIME", help="ended by")
    wait.add_argument("--hours", type=hours, required=True, metavar="H", help="for how long")
    wait.add_argument("--claim", action="store_true", help="hold an offered slot for me to claim (default: book it)")
    wait.add_argument("--purpose", default="", help="what the GPUs are for")
    add("waitlist", cmd_waitlist, render_list, "what you wait for, and slots on offer")
    for name, verb, help_text in (
        ("claim", "Claimed:", "take the slot on offer: it becomes your booking"),
        ("decline", "Declined:", "pass the slot on offer to the next person"),
        ("leave", "Left:", "leave the waitlist"),
    ):
        command = add(name, _action(name), render_entry(verb), help_text)
        command.add_argument("id", type=count, help="waitlist entry id")


def cmd_wait(client: Client, args: argparse.Namespace) -> Any:
    body: dict[str, Any] = {
        "earliest_start": args.earliest.isoformat(),
        "latest_end": args.latest.isoformat(),
        "duration_minutes": round(args.hours * 60),
        "auto_book": not args.claim,
        "purpose": args.purpose,
    }
    if args.gpu_ids:
        body["gpus"] = args.gpu_ids
    else:
        body |= {"node": args.node} if args.node else {"model": args.model}
        body["count"] = args.count
        if args.profile:
            body["profile"] = args.profile
    return client.post("waitlist/", body)


def cmd_waitlist(client: Client, args: argparse.Namespace) -> Any:
    return client.get_all("waitlist/", {"open": True})


def _action(name: str) -> Callable[[Client, argparse.Namespace], Any]:
    def act(client: Client, args: argparse.Namespace) -> Any:
        return client.post(f"waitlist/{args.id}/{name}/", {})

    return act


def describe(entry: dict[str, Any]) -> str:
    return f"#{entry['id']} {entry['want']}: {state_of(entry)}"


def state_of(entry: dict[str, Any]) -> str:
    state = entry["status"]
    if state == "offered" and entry.get("offer"):
        state = f"offered {fmt_period(entry['offer']['start'], entry['offer']['end'])}"
        if entry.get("claim_by"):
            state += f", held until {fmt_moment(entry['claim_by'])}: gpubook claim {entry['id']}"
    elif state == "booked":
        state = f"booked: reservation #{entry['reservation']}"
    elif state == "waiting" and entry.get("position"):
        state = f"waiting, number {entry['position']} in the queue"
    return state


def render_entry(verb: str) -> Callable[[Any], None]:
    def render(entry: Any) -> None:
        print(verb, describe(entry))
        if entry.get("skip_reason"):
            print(" ", entry["skip_reason"])

    return render


def render_list(entries: list[dict[str, Any]]) -> None:
    if not entries:
        print("You are not waiting for anything.")
        return
    rows = [(entry["id"], entry["want"], state_of(entry)) for entry in entries]
    print_table(("ID", "WAITING FOR", "STATE"), rows)


def waitlist_hint(args: argparse.Namespace) -> str:
    """After ``book`` was refused because the slot is taken: how to wait for it instead."""
    if getattr(args, "gpu_ids", None):
        target = f"--gpu-ids {','.join(map(str, args.gpu_ids))}"
    elif getattr(args, "node", None):
        target = f"--node {args.node} --count {getattr(args, 'count', None) or getattr(args, 'gpus', None) or 1}"
    else:
        target = "--node NODE --count N"
    return f"to wait for it: gpubook wait {target} --from TIME --until TIME --hours H"
