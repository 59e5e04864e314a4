"""The "Environments" part of a booking's page (reservations/detail_parts.py): launch one, see what runs, how to
reach a notebook, its output, and stop it."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from environments.models import Launch
from environments.selectors import booking_launches, environments_offered, launch_events
from nodes.models import Node
from reservations.models import Reservation


def reservation_launches(*, reservation: Reservation, viewer: Any, now: datetime) -> dict[str, Any] | None:
    """What the part shows; None (no part) when there is nothing to launch and nothing launched."""
    is_holder = reservation.user_id == viewer.pk
    launches = booking_launches(reservation=reservation)
    agent = reservation.node.manager == Node.Manager.AGENT  # a Slurm node runs jobs, not launches
    can_launch = is_holder and reservation.is_live and reservation.end > now and agent
    offered = list(environments_offered()) if can_launch else []
    if not launches and not offered:
        return None
    return {
        "launches": [_shown(launch, is_holder=is_holder) for launch in launches],
        "offered": offered,
        "can_launch": can_launch,
        "starts_later": reservation.start > now,
        "events": launch_events(reservation=reservation),
        "any_open": any(launch.is_open for launch in launches),
    }


def _shown(launch: Launch, *, is_holder: bool) -> dict[str, Any]:
    tunnel = tunnel_command(launch)
    return {
        "launch": launch,
        "stoppable": launch.is_open and launch.stop_requested_at is None,
        "tunnel": tunnel,
        "url": f"http://127.0.0.1:{launch.port}/" if tunnel else "",
        "token": launch.token if is_holder else "",  # the notebook's key: its holder's alone, not even admins'
    }


def tunnel_command(launch: Launch) -> str:
    """How its holder reaches a running launch's port: it listens on the node's loopback only, so through an SSH
    tunnel to the node, as the holder's account; "" when it runs no server."""
    if launch.state != Launch.State.RUNNING or not launch.port:
        return ""
    reservation = launch.reservation
    user = reservation.user.unix_username or "<unix username>"
    return f"ssh -N -L {launch.port}:127.0.0.1:{launch.port} {user}@{reservation.node.hostname}"
