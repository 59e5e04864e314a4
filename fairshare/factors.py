"""Each person's fair-share factor, Slurm's classic ``F = 2^(-U/S)`` (docs/booking-rules.md, "Fair share").

- **Usage** ``U``: the GPU-hours a person booked (approved time, up to now) plus FAIRSHARE_USED_WEIGHT times the
  GPU-hours they used (minutes at or over the usage threshold, from the telemetry rollup), a MIG slice counting
  as its share of its card. Each hour counts ``2^(-age / FAIRSHARE_HALF_LIFE_DAYS)``: an hour a half-life ago
  counts half. Hours older than FAIRSHARE_LOOKBACK_HALF_LIVES half-lives (under half a percent) are not read.
  Normalised: a person's decayed usage over everyone's.
- **Share** ``S``: each group's shares (GroupShare, FAIRSHARE_DEFAULT_SHARES where an admin set none) over the
  shares of every group with an active member, split equally among the group's active members; people in no
  group form one more group of FAIRSHARE_DEFAULT_SHARES. A person in several groups gets their part of each.
  The shares of all active people add up to 1.
- ``F = 2^(-U/S)``: 1 for nobody's usage, 0.5 for usage equal to one's share, towards 0 above it.

Everything is read in a few queries for everyone at once (the factors are relative): ``fairshare_for`` for the
waitlist's order, ``fairshare_table`` for the admins' table and /metrics.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from accounting.models import UsageHour
from nodes.models import card_share
from reservations.models import Allocation, Reservation

DAY_SECONDS = 86_400.0
NO_GROUP = "(no group)"


@dataclass(frozen=True)
class GroupPart:
    """What one of a person's groups gives them: the group's shares, everyone's, and its active members."""

    name: str
    shares: int
    total_shares: int
    members: int

    @property
    def share(self) -> float:
        return self.shares / self.total_shares / self.members


@dataclass(frozen=True)
class FairShare:
    user_id: int
    username: str
    booked_hours: float  # decayed GPU-hours booked
    used_hours: float  # decayed GPU-hours used
    usage: float  # normalised: this person's decayed usage over everyone's, 0..1
    share: float  # normalised: 0..1, everyone's add up to 1
    factor: float  # 2^(-usage/share), 0..1
    groups: tuple[GroupPart, ...] = field(default=())
    half_life_days: float = 7.0
    used_weight: float = 1.0

    @property
    def effective_hours(self) -> float:
        return self.booked_hours + self.used_weight * self.used_hours

    def order_key(self, arrived: datetime) -> tuple[float, datetime]:
        """Where this person's request stands in a queue: the highest factor first, then the earliest to
        arrive (``sorted(entries, key=lambda e: factors[e.user_id].order_key(e.created_at))``)."""
        return (-self.factor, arrived)

    def explanation(self) -> str:
        """Why the factor is what it is, in words a researcher can check."""
        parts = "; ".join(
            f"group {part.name}: {part.shares} of {part.total_shares} shares, split between {part.members}"
            for part in self.groups
        )
        share = f"{self.share:.1%} ({parts})" if parts else f"{self.share:.1%}"
        return (
            f"Your usage is {self.effective_hours:.1f} GPU-hours ({self.booked_hours:.1f} booked + "
            f"{self.used_weight:g} × {self.used_hours:.1f} used), each hour halved every {self.half_life_days:g} days: "
            f"{self.usage:.1%} of everyone's. Your share is {share}. "
            f"Factor 2^(-{self.usage:.3f} / {self.share:.3f}) = {self.factor:.2f}."
        )


def fairshare_for(user_ids: Iterable[int], *, now: datetime) -> dict[int, FairShare]:
    """The factors of these people, computed against everyone's usage and shares in a few queries however
    many are asked. Someone not active has no share: factor 1 if they used nothing in the look-back, else 0."""
    wanted = set(user_ids)
    table, booked, used = _compute(now)
    missing = wanted - set(table)
    names = dict(get_user_model().objects.filter(pk__in=missing).values_list("pk", "username")) if missing else {}
    half_life, weight = float(settings.FAIRSHARE_HALF_LIFE_DAYS), float(settings.FAIRSHARE_USED_WEIGHT)
    total = sum(booked.values()) + weight * sum(used.values())
    for user_id in missing:
        mine = booked.get(user_id, 0.0) + weight * used.get(user_id, 0.0)
        table[user_id] = FairShare(
            user_id=user_id,
            username=names.get(user_id, "?"),
            booked_hours=booked.get(user_id, 0.0),
            used_hours=used.get(user_id, 0.0),
            usage=mine / total if total > 0 else 0.0,
            share=0.0,
            factor=0.0 if mine > 0 else 1.0,
            half_life_days=half_life,
            used_weight=weight,
        )
    return {user_id: table[user_id] for user_id in wanted}


def fairshare_table(*, now: datetime) -> list[FairShare]:
    """Every active person's factor, lowest first (who is furthest over their share)."""
    return sorted(_compute(now)[0].values(), key=lambda item: (item.factor, item.username))


def _compute(now: datetime) -> tuple[dict[int, FairShare], dict[int, float], dict[int, float]]:
    """Every active person's factor; and everyone's decayed GPU-hours booked and used (active or not)."""
    half_life = float(settings.FAIRSHARE_HALF_LIFE_DAYS)
    weight = float(settings.FAIRSHARE_USED_WEIGHT)
    since = now - timedelta(days=half_life * settings.FAIRSHARE_LOOKBACK_HALF_LIVES)
    booked, used = _booked_hours(now, since, half_life), _used_hours(now, since, half_life)
    effective = {user: booked.get(user, 0.0) + weight * used.get(user, 0.0) for user in booked.keys() | used.keys()}
    total = sum(effective.values())
    shares, names = _shares()
    table = {}
    for user_id, groups in shares.items():
        share = sum(part.share for part in groups)
        usage = effective.get(user_id, 0.0) / total if total > 0 else 0.0
        table[user_id] = FairShare(
            user_id=user_id,
            username=names[user_id],
            booked_hours=booked.get(user_id, 0.0),
            used_hours=used.get(user_id, 0.0),
            usage=usage,
            share=share,
            factor=2 ** (-usage / share),  # every active person has a share
            groups=tuple(groups),
            half_life_days=half_life,
            used_weight=weight,
        )
    return table, booked, used


def _decay(age_days: float, half_life: float) -> float:
    return 2 ** (-max(age_days, 0.0) / half_life)


def _booked_hours(now: datetime, since: datetime, half_life: float) -> dict[int, float]:
    """Approved time up to now, each moment decayed by its age: the integral of 2^(-age/h) over the slot."""
    rows = Allocation.objects.filter(
        active=True, reservation__status=Reservation.Status.APPROVED, start__lt=now, end__gt=since
    ).values_list("reservation__user_id", "start", "end", "gpu__compute_slices", "gpu__parent__compute_slices")
    hours: dict[int, float] = defaultdict(float)
    scale = half_life / math.log(2) * 24  # days of decayed time, in hours
    for user_id, start, end, unit_slices, card_slices in rows:
        newest = (now - min(end, now)).total_seconds() / DAY_SECONDS
        oldest = (now - max(start, since)).total_seconds() / DAY_SECONDS
        decayed = scale * (_decay(newest, half_life) - _decay(oldest, half_life))
        hours[user_id] += decayed * float(card_share(unit_slices, card_slices))
    return hours


def _used_hours(now: datetime, since: datetime, half_life: float) -> dict[int, float]:
    rows = UsageHour.objects.filter(user__isnull=False, hour__gte=since, hour__lt=now, used_minutes__gt=0).values_list(
        "user_id", "hour", "used_minutes", "gpu__compute_slices", "gpu__parent__compute_slices"
    )
    hours: dict[int, float] = defaultdict(float)
    for user_id, hour, minutes, unit_slices, card_slices in rows:
        age = (now - hour - timedelta(minutes=30)).total_seconds() / DAY_SECONDS
        hours[user_id] += minutes / 60 * _decay(age, half_life) * float(card_share(unit_slices, card_slices))
    return hours


def _shares() -> tuple[dict[int, list[GroupPart]], dict[int, str]]:
    """Each active person's parts of their groups' shares, and their names."""
    users = get_user_model().objects.filter(is_active=True)
    names = dict(users.values_list("pk", "username"))
    memberships = Group.user_set.through.objects.filter(user__is_active=True).values_list(
        "user_id", "group_id", "group__name", "group__fair_share__shares"
    )
    members: dict[int, list[int]] = defaultdict(list)
    group_names: dict[int, str] = {}
    set_shares: dict[int, int] = {}
    for user_id, group_id, name, shares in memberships:
        members[group_id].append(user_id)
        group_names[group_id] = name
        if shares is not None:
            set_shares[group_id] = shares
    default = settings.FAIRSHARE_DEFAULT_SHARES
    grouped = {user_id for people in members.values() for user_id in people}
    ungrouped = [user_id for user_id in names if user_id not in grouped]
    total = sum(set_shares.get(group_id, default) for group_id in members) + (default if ungrouped else 0)
    parts: dict[int, list[GroupPart]] = defaultdict(list)
    for group_id, people in members.items():
        part = GroupPart(group_names[group_id], set_shares.get(group_id, default), total, len(people))
        for user_id in people:
            parts[user_id].append(part)
    for user_id in ungrouped:
        parts[user_id].append(GroupPart(NO_GROUP, default, total, len(ungrouped)))
    return {user_id: sorted(parts[user_id], key=lambda part: part.name) for user_id in names}, names
