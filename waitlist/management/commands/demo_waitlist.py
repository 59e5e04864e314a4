"""The demo lab's groups, their fair shares and a waitlist entry (scripts/run, after demo_lab): so that the
fair-share and waitlist pages show something. Idempotent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand
from django.utils import timezone

from fairshare.models import GroupShare
from nodes.models import Node
from reservations.exceptions import BookingError
from reservations.timegrid import floor_to_grid
from waitlist.models import Entry
from waitlist.services import Want, entry_join

# Group, its shares, its members (demo_lab's researchers).
GROUPS = (("vision", 2, ("alice",)), ("nlp", 1, ("bob",)))


class Command(BaseCommand):
    help = "Give the demo lab's researchers groups with fair shares, and alice a place on the waitlist (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        User = get_user_model()
        for name, shares, members in GROUPS:
            group, _ = Group.objects.get_or_create(name=name)
            GroupShare.objects.get_or_create(group=group, defaults={"shares": shares})
            group.user_set.add(*User.objects.filter(username__in=members))
        alice = User.objects.filter(username="alice").first()
        node = Node.objects.filter(name="gpu-a100").first()
        if alice is None or node is None or Entry.objects.filter(user=alice, status__in=Entry.OPEN_STATUSES).exists():
            return
        start = floor_to_grid(timezone.now())
        # Three GPUs of gpu-a100 for the next few hours: taken (demo_lab books them), so she waits.
        want = Want(
            node=node,
            count=3,
            earliest_start=start,
            latest_end=start + timedelta(hours=6),
            duration=timedelta(hours=2),
            purpose="hyper-parameter sweep",
        )
        try:
            entry = entry_join(user=alice, want=want)
        except BookingError as error:
            self.stdout.write(f"  no waitlist entry for alice: {error}")
            return
        self.stdout.write(f"  alice waits for {entry.want_text} ({entry.get_status_display().lower()})")
