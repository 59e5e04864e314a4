"""``gpubook environments``, ``launch``, ``launches``, ``launch-log``, ``launch-stop``: a booking's environments from a
terminal (the API's /environments/ and /launches/ endpoints)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from gpubook.client import ApiError, Client
from gpubook.terminal import fmt_moment, print_table

Add = Callable[..., argparse.ArgumentParser]


def add_launch_commands(add: Add, *, ident: Any) -> None:
    """Register the commands with cli.py's ``add`` and its id type (``ident``)."""
    add("environments", cmd_environments, render_environments, "the environments you can launch in a booking")
    launch = add("launch", cmd_launch, render_launch("Launched:"), "run an environment in your booking")
    launch.add_argument("reservation", type=ident, help="your reservation's id")
    launch.add_argument("environment", help="the environment's id or name (gpubook environments lists them)")
    launches = add("launches", cmd_launches, render_launches, "your launches and their state")
    launches.add_argument("--reservation", type=ident, metavar="ID", help="only this reservation's")
    log = add("launch-log", cmd_launch_show, render_launch_log, "a launch's state, connection and output")
    log.add_argument("id", type=ident, help="launch id")
    stop = add("launch-stop", cmd_launch_stop, render_launch("Stopping:"), "stop a launch and all it started")
    stop.add_argument("id", type=ident, help="launch id")


def cmd_environments(client: Client, args: argparse.Namespace) -> Any:
    return client.get_all("environments/")


def cmd_launch(client: Client, args: argparse.Namespace) -> Any:
    environment = environment_id(client, args.environment)
    return client.post("launches/", {"reservation": args.reservation, "environment": environment})


def environment_id(client: Client, given: str) -> int:
    """The id given, or the id of the environment with that name (case does not matter)."""
    if given.isascii() and given.isdecimal():
        return int(given)
    environments = client.get_all("environments/")
    found = [item for item in environments if item["name"].casefold() == given.casefold()]
    if not found:
        names = ", ".join(item["name"] for item in environments) or "none"
        raise ApiError(400, "invalid", f"No environment named {given!r}. Offered: {names}.")
    return int(found[0]["id"])


def launch_with_booking(client: Client, reservation: dict[str, Any], environment: int) -> str:
    """``gpubook book --launch``: launch in the booking just made; a line to tell the person either way (the booking
    stands if the launch is refused)."""
    try:
        launch = client.post("launches/", {"reservation": reservation["id"], "environment": environment})
    except ApiError as refused:
        return f"not launched: {refused.message} The booking stands: gpubook launch {reservation['id']} ENVIRONMENT."
    return (
        f"launch #{launch['id']} {launch['environment_name']}: starts with the slot (gpubook launch-log {launch['id']})"
    )


def cmd_launches(client: Client, args: argparse.Namespace) -> Any:
    return client.get_all("launches/", {"reservation": args.reservation} if args.reservation else None)


def cmd_launch_show(client: Client, args: argparse.Namespace) -> Any:
    return client.get(f"launches/{args.id}/")


def cmd_launch_stop(client: Client, args: argparse.Namespace) -> Any:
    return client.post(f"launches/{args.id}/stop/", {})


def describe(launch: dict[str, Any]) -> str:
    state = launch["state_label"]
    if launch["stop_requested"] and launch["state"] in ("requested", "starting", "running"):
        state += ", stopping"
    if launch.get("message"):
        state += f" ({launch['message']})"
    where = f"in reservation #{launch['reservation']} on {launch['node']}"
    return f"#{launch['id']} {launch['environment_name']} {where}: {state}"


def render_launch(verb: str) -> Callable[[Any], None]:
    def render(launch: Any) -> None:
        print(verb, describe(launch))

    return render


def render_environments(environments: list[dict[str, Any]]) -> None:
    if not environments:
        print("No environments are offered: the admins list them.")
        return
    rows = [(e["id"], e["name"], e["kind"], e["image"] or " ".join(e["command"])) for e in environments]
    print_table(("ID", "NAME", "KIND", "IMAGE OR COMMAND"), rows)


def render_launches(launches: list[dict[str, Any]]) -> None:
    if not launches:
        print("No launches.")
        return
    rows = [
        (
            item["id"],
            item["reservation"],
            item["environment_name"],
            item["state_label"],
            fmt_moment(item["requested_at"]),
        )
        for item in launches
    ]
    print_table(("ID", "RESERVATION", "ENVIRONMENT", "STATE", "ASKED"), rows)


def render_launch_log(launch: dict[str, Any]) -> None:
    print(describe(launch))
    if launch.get("ssh_tunnel"):
        print(f"connect: {launch['ssh_tunnel']}")
        if launch.get("local_url"):
            print(f"then open {launch['local_url']}")
    if launch.get("token"):
        print(f"token: {launch['token']}")
    print(launch.get("log_tail") or "(no output yet)", end="" if launch.get("log_tail", "").endswith("\n") else "\n")
