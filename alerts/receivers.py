"""What alerts does when accounts announce a change (accounts/signals.py)."""

from __future__ import annotations

from typing import Any

from django.db.models import Q
from django.dispatch import receiver
from django.utils import timezone

from accounts.signals import unix_username_changed, user_deactivated
from alerts.models import Alert
from alerts.services import alerts_resolve


def _refusals_of(user_id: int, *usernames: str | None) -> Any:
    names = [name for name in usernames if name]
    return Alert.objects.filter(Q(user_id=user_id) | Q(username__in=names), kind=Alert.Kind.ACCOUNT_REFUSED)


@receiver(unix_username_changed)
def account_refusals_fixed(sender: type, user_id: int, before: str | None, **kwargs: Any) -> None:
    """The binding a node refused was changed: the nodes are told the new one, and judge it afresh
    (a refusal of the new name opens a new alert)."""
    alerts_resolve(
        _refusals_of(user_id, before), now=timezone.now(), resolution="the person's unix username was changed"
    )


@receiver(user_deactivated)
def account_refusals_moot(sender: type, user_id: int, **kwargs: Any) -> None:
    alerts_resolve(_refusals_of(user_id), now=timezone.now(), resolution="the account was deactivated")
