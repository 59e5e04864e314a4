"""Reads of accounts that pages share."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from accounts.models import User


@dataclass(frozen=True)
class UnixUsernameRequest:
    """A person's request for a unix username, with what an admin should know before confirming."""

    user: User
    name: str
    holder: User | None  # who already has that name confirmed
    also_requested_by: int  # how many other people ask for the same name

    @property
    def warnings(self) -> list[str]:
        found = []
        if self.holder is not None:
            found.append(f"already the unix username of {self.holder.get_username()}: confirming it fails")
        if self.also_requested_by:
            others = self.also_requested_by
            found.append(f"also requested by {others} other {'person' if others == 1 else 'people'}")
        if self.user.unix_username:
            found.append(f"replaces {self.user.unix_username}, whose GPUs close when it is confirmed")
        return found


def unix_username_requests() -> list[UnixUsernameRequest]:
    """Active people waiting for an admin to confirm a unix username, oldest account first."""
    waiting = list(
        User.objects.filter(is_active=True).exclude(unix_username_requested="").order_by("date_joined", "pk")
    )
    names = [user.unix_username_requested for user in waiting]
    counts = Counter(names)
    holders = {user.unix_username: user for user in User.objects.filter(unix_username__in=names)}
    return [
        UnixUsernameRequest(
            user=user,
            name=user.unix_username_requested,
            holder=(holder if (holder := holders.get(user.unix_username_requested)) and holder.pk != user.pk else None),
            also_requested_by=counts[user.unix_username_requested] - 1,
        )
        for user in waiting
    ]
