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


# The port on the holder's own computer that a tunnel to a launch's Unix socket listens on (they may pick another).
LOCAL_PORT = 8888


def _shown(launch: Launch, *, is_holder: bool) -> dict[str, Any]:
    tunnel = tunnel_command(launch)
    return {
        "launch": launch,
        "stoppable": launch.is_open and launch.stop_requested_at is None,
        "tunnel": tunnel,
        "url": local_url(launch),
        "local_port": _local_port(launch),
        "token": launch.token if is_holder else "",  # the notebook's key: its holder's alone, not even admins'
    }


def tunnel_command(launch: Launch) -> str:
    """How its holder reaches a running launch: through an SSH tunnel to the node, as the holder's account, to its
    Unix socket (in a directory only that account can enter: sshd connects as them) or to its port on the node's
    loopback; "" when it serves nothing (or the node has not seen it serve yet)."""
    if launch.state != Launch.State.RUNNING or not (launch.socket or launch.port):
        return ""
    reservation = launch.reservation
    user = reservation.user.unix_username or "<unix username>"
    target = launch.socket if launch.socket else f"127.0.0.1:{launch.port}"
    return f"ssh -N -L {_local_port(launch)}:{target} {user}@{reservation.node.hostname}"


def local_url(launch: Launch) -> str:
    """Where the holder browses once the tunnel runs; "" without one."""
    if not tunnel_command(launch):
        return ""
    return f"http://127.0.0.1:{_local_port(launch)}/"


def _local_port(launch: Launch) -> int | None:
    """The port on the holder's computer the tunnel listens on: LOCAL_PORT for a socket, the node's port for a port
    (the same number both ends, as before sockets)."""
    return LOCAL_PORT if launch.socket else launch.port
