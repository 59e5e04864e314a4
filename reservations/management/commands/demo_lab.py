"""Create a small demo lab: two nodes of simulated GPUs, an admin, two researchers, a few bookings.

Running it again changes nothing that exists: it only adds what is missing, and prints passwords
only for accounts it has just created. Each booking of the plan is made when its person has none of that
purpose still to come (the first time, when a demo is started again after its bookings are over, and
when a newer plan adds one), so a demo always starts with bookings running on both nodes (their jobs:
manage.py demo_jobs), one of them left idle on purpose.
"""

from __future__ import annotations

import secrets
from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from django.utils import timezone

from gpubook_agent.gpus.simulated import simulated_uuid
from nodes.mig import simulated_mig_cards_make
from nodes.models import Gpu, Node
from reservations import services
from reservations.demo_jobs import LEFT_IDLE_PURPOSE
from reservations.exceptions import BookingError
from reservations.models import Limit, Reservation
from reservations.timegrid import floor_to_grid

NODES = [
    ("gpu-a100", "gpu-a100.lab.example", "NVIDIA A100-SXM4-80GB", 81920, False),
    ("gpu-4090", "gpu-4090.lab.example", "NVIDIA GeForce RTX 4090", 24564, True),
]
# gpu-a100's GPU 0 is split with MIG, its layout confirmed (the simulated agent reports the same: demo_agents
# writes it into SIMULATED_MIG from the slices made here).
DEMO_MIG = {"gpu-a100": "0:3g.40gb,2g.20gb,2g.20gb"}
USERS = [
    # username, unix username (the account on the GPU nodes; scripts/run creates them when it can), admin?
    ("carol", "demo-carol", True),
    ("alice", "demo-alice", False),
    ("bob", "demo-bob", False),
]


class Command(BaseCommand):
    help = (
        "Create the demo lab (idempotent): 2 nodes x 4 simulated GPUs (one split with MIG), an admin, "
        "2 researchers, bookings."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        with transaction.atomic():
            self._nodes()
            users = self._users()
            Limit.objects.get_or_create(
                scope=Limit.Scope.SITE,
                defaults={
                    "max_gpus_at_once": 4,
                    "max_slot_hours": 48,
                    "weekly_gpu_hours": 200,
                    "max_days_ahead": 30,
                },
            )
        self._bookings(users)
        self.stdout.write(
            self.style.SUCCESS("Demo lab ready: nodes gpu-a100 and gpu-4090, users carol (admin), alice, bob.")
        )

    def _nodes(self) -> None:
        for name, hostname, model, memory, approval in NODES:
            node, _ = Node.objects.get_or_create(
                name=name,
                defaults={
                    "hostname": hostname,
                    "description": f"4 x {model} (simulated)",
                    "requires_approval": approval,
                },
            )
            for index in range(4):
                # The same UUIDs the simulated agent reports for this node (scripts/run starts one).
                Gpu.objects.get_or_create(
                    node=node,
                    index=index,
                    parent=None,
                    defaults={"uuid": simulated_uuid(name, index), "model": model, "memory_mib": memory},
                )
            if name in DEMO_MIG:
                simulated_mig_cards_make(node, DEMO_MIG[name])

    def _users(self) -> dict[str, Any]:
        User = get_user_model()
        users = {}
        for username, unix_username, admin in USERS:
            user = User.objects.filter(username=username).first()
            if user is None:
                password = secrets.token_urlsafe(12)
                user = User.objects.create_user(
                    username=username,
                    password=password,
                    email=f"{username}@lab.example",
                    unix_username=unix_username,
                    is_staff=admin,
                    is_superuser=admin,
                )
                role = "admin" if admin else "researcher"
                self.stdout.write(f"  created {role} {username!r} with password {password!r} (shown once)")
            users[username] = user
        return users

    def _bookings(self, users: dict[str, Any]) -> None:
        now = timezone.now()
        cell = floor_to_grid(now)
        a100 = list(Gpu.objects.filter(node__name="gpu-a100", parent=None).order_by("index"))
        rtx = list(Gpu.objects.filter(node__name="gpu-4090", parent=None).order_by("index"))
        slices = list(Gpu.objects.filter(node__name="gpu-a100", parent__isnull=False).order_by("placement_start"))
        plan = [
            (users["alice"], a100[1:2], cell, cell + timedelta(hours=3), "fine-tuning a 7B model"),
            (users["carol"], slices[:1], cell, cell + timedelta(hours=4), "notebook on a MIG slice"),
            (users["alice"], slices[-1:], cell + timedelta(hours=1), cell + timedelta(hours=3), "inference tests"),
            (users["bob"], a100[2:3], cell, cell + timedelta(hours=5), "protein folding sweep"),
            (users["bob"], rtx[:1], cell + timedelta(days=1), cell + timedelta(days=1, hours=8), "rendering"),
            (users["alice"], rtx[1:3], cell, cell + timedelta(hours=2), "ablation runs"),
            (users["bob"], a100[3:4], cell, cell + timedelta(hours=2), LEFT_IDLE_PURPOSE),
        ]
        created = []
        for user, gpus, start, end, purpose in plan:
            still_to_come = Reservation.objects.filter(
                user=user, purpose=purpose, status__in=Reservation.LIVE_STATUSES, end__gt=now
            )
            if still_to_come.exists():  # a demo started again while its bookings run
                continue
            try:
                created.append(services.reservation_create(user=user, gpus=gpus, start=start, end=end, purpose=purpose))
            except BookingError as error:  # a demo started again: someone else's booking, or a limit reached
                self.stdout.write(f"  not booked for {user.username} ({purpose}): {error}")
        # gpu-4090 needs approval: approve alice's request there and leave bob's for the admin to decide.
        for reservation in created:
            if reservation.user == users["alice"] and reservation.node.requires_approval:
                services.reservation_approve(reservation=reservation, actor=users["carol"], reason="demo")
        if created:
            self.stdout.write(f"  booked {len(created)} demo reservations around {cell:%Y-%m-%d %H:%M} UTC")
