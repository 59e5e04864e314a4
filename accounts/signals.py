"""What the accounts app announces once it has committed; higher apps react to it.

- ``user_deactivated(user_id)``: an account went from active to inactive, however that happened
  (Django admin, a management command, a directory login that found the account disabled, a
  script calling ``save()``). reservations ends the person's bookings.
- ``unix_username_changed(user_id, before, after)``: the account that receives a person's GPUs
  changed (an admin confirmed or set it, a directory login brought a new one). reservations
  re-sends the nodes where the person holds bookings.

Both are caught on ``User`` saves here, in one place, because accounts change through many doors
that the booking rules cannot all call; writes that bypass ``save()`` (the services' compare-and-
swap updates) send them themselves. A signal carries news of a change already made; the decision
of what follows stays in the receiving app's services.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_save, pre_save
from django.dispatch import Signal, receiver

from accounts.models import User
from audit.services import audit_record

user_deactivated = Signal()
unix_username_changed = Signal()

WATCHED = ("is_active", "unix_username")


def announce_deactivated(user_id: int) -> None:
    transaction.on_commit(lambda: user_deactivated.send(sender=User, user_id=user_id))


def announce_unix_username(user_id: int, before: str | None, after: str | None) -> None:
    transaction.on_commit(lambda: unix_username_changed.send(sender=User, user_id=user_id, before=before, after=after))


@receiver(pre_save, sender=User)
def _remember_before(sender: type, instance: User, raw: bool = False, update_fields: Any = None, **kwargs: Any) -> None:
    if raw or instance.pk is None or (update_fields is not None and not set(WATCHED) & set(update_fields)):
        return  # a login's last_login update, say: nothing watched can change
    instance._watched_before = User.objects.filter(pk=instance.pk).values(*WATCHED).first()  # type: ignore[attr-defined]


@receiver(post_save, sender=User)
def _announce_changes(sender: type, instance: User, raw: bool = False, **kwargs: Any) -> None:
    before = instance.__dict__.pop("_watched_before", None)
    if raw or before is None:
        return
    if before["is_active"] and not instance.is_active:
        audit_record(actor=None, action="user.deactivate", target=instance, before={"is_active": True})
        announce_deactivated(instance.pk)
    if before["unix_username"] != instance.unix_username:
        announce_unix_username(instance.pk, before["unix_username"], instance.unix_username)
