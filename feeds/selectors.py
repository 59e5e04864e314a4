"""Reads for calendar feeds: whose feed a URL is, a user's feed URLs, and a feed's bookings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth import get_user_model
from django.db.models import CharField, Count, Max, OuterRef, Subquery
from django.db.models.functions import Cast, Coalesce
from django.urls import reverse

from accounts.models import User
from audit.models import AuditEntry
from feeds.models import FeedKey
from feeds.tokens import FeedToken, feed_token, feed_token_valid
from nodes.models import Gpu, Node
from reservations.models import Allocation, Reservation


@dataclass(frozen=True)
class FeedLink:
    """One feed a user may subscribe to: their own bookings (``node`` None) or a node's."""

    node: str | None
    title: str
    path: str  # absolute path; pages and the API make it a full URL


def feed_generation(user: User) -> int:
    return get_user_model().objects.filter(pk=user.pk).values_list("feed_key__generation", flat=True).first() or 0


def feed_links(*, user: User) -> list[FeedLink]:
    """The user's feed URLs: their own bookings first, then one per node by name. Two queries."""
    return _feed_links(user, feed_generation(user))


@dataclass(frozen=True)
class FeedListing:
    """What the profile page and the API show of a user's feeds."""

    rotated_at: datetime | None  # when the user last replaced their URLs; None: never
    feeds: list[tuple[FeedLink, str]]  # each feed with its full URL


def feed_listing(user: User, build_url: Callable[[str], str]) -> FeedListing:
    """The user's feeds with full URLs (``build_url`` makes one of a path) and when they were last
    rotated. Two queries: the user's FeedKey, the nodes."""
    generation, rotated_at = FeedKey.objects.filter(user=user).values_list("generation", "rotated_at").first() or (
        0,
        None,
    )
    return FeedListing(
        rotated_at=rotated_at, feeds=[(link, build_url(link.path)) for link in _feed_links(user, generation)]
    )


def _feed_links(user: User, generation: int) -> list[FeedLink]:
    def path(node_id: int | None) -> str:
        return reverse("feed", kwargs={"token": feed_token(user_id=user.pk, node_id=node_id, generation=generation)})

    links = [FeedLink(node=None, title="My bookings", path=path(None))]
    for pk, name in Node.objects.order_by("name").values_list("pk", "name"):
        links.append(FeedLink(node=name, title=f"All bookings on {name}", path=path(pk)))
    return links


def feed_subject(token: FeedToken) -> tuple[User, Node | None] | None:
    """The active user and node (None for their own feed) that a token stands for, or None when
    the token is not valid now (unknown or inactive user, rotated, forged, no such node)."""
    user = (
        get_user_model()
        .objects.filter(pk=token.user_id, is_active=True)
        .annotate(feed_generation=Coalesce("feed_key__generation", 0))
        .first()
    )
    if user is None or not feed_token_valid(token, generation=user.feed_generation):
        return None
    if token.node_id is None:
        return user, None
    node = Node.objects.filter(pk=token.node_id).first()
    return (user, node) if node is not None else None


@dataclass(frozen=True)
class FeedBooking:
    id: int
    owner_id: int
    owner: str
    node: str
    hostname: str
    start: datetime
    end: datetime
    status: str
    purpose: str
    created_at: datetime
    changed_at: datetime  # the last audited change (or its creation)
    changes: int  # audited changes after the booking was made: the event's SEQUENCE
    released: bool
    gpus: list[Gpu]  # by index
    series_id: int | None = None  # the recurring booking it is an occurrence of


def feed_bookings(*, user: User, node: Node | None, start: datetime, end: datetime) -> list[FeedBooking]:
    """Bookings of any status overlapping [start, end): the user's own (``node`` None) or all on
    ``node``. Two queries whatever their number: the bookings with their audit counts, their GPUs."""
    reservations = Reservation.objects.filter(start__lt=end, end__gt=start)
    reservations = reservations.filter(user=user) if node is None else reservations.filter(node=node)
    audit = AuditEntry.objects.filter(
        target_type=Reservation._meta.label_lower, target_id=Cast(OuterRef("pk"), CharField())
    ).order_by()
    rows = (
        reservations.annotate(
            audited=Subquery(audit.values("target_id").annotate(n=Count("id")).values("n")[:1]),
            audited_last=Subquery(audit.values("target_id").annotate(last=Max("created_at")).values("last")[:1]),
        )
        .order_by("start", "id")
        .values_list(
            "id",
            "user_id",
            "user__username",
            "node__name",
            "node__hostname",
            "start",
            "end",
            "status",
            "purpose",
            "created_at",
            "released_at",
            "audited",
            "audited_last",
            "series_id",
            named=True,
        )
    )
    gpus: dict[int, list[Gpu]] = {}
    for allocation in (
        Allocation.objects.filter(reservation__in=reservations.values("pk"))
        .select_related("gpu")
        .order_by("reservation_id", "gpu__index")
    ):
        gpus.setdefault(allocation.reservation_id, []).append(allocation.gpu)
    return [
        FeedBooking(
            id=row.id,
            owner_id=row.user_id,
            owner=row.user__username,
            node=row.node__name,
            hostname=row.node__hostname,
            start=row.start,
            end=row.end,
            status=row.status,
            purpose=row.purpose,
            created_at=row.created_at,
            changed_at=max(row.created_at, row.audited_last) if row.audited_last else row.created_at,
            changes=max((row.audited or 0) - 1, 0),
            released=row.released_at is not None,
            gpus=gpus.get(row.id, []),
            series_id=row.series_id,
        )
        for row in rows
    ]
