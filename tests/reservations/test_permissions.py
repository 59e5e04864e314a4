"""The buttons every page offers (reservations.permissions) are exactly what the services accept.

For each state a booking can be in, and each person looking at it, every action is tried through
its service in a savepoint that is rolled back: offered must mean accepted, and not offered refused.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.db import transaction
from django.utils import timezone

from reservations import services
from reservations.exceptions import BookingError
from reservations.models import Reservation
from reservations.permissions import reservation_actions
from reservations.selectors import pending_extension
from tests.conftest import at
from tests.factories import book, node_with_gpus

pytestmark = pytest.mark.usefixtures("clock")
ACTIONS = ("cancel", "release", "extend", "approve", "reject")


class _RollBack(Exception):
    pass


def accepted(reservation: Reservation, action: str, actor) -> bool:
    calls: dict[str, Callable[[], object]] = {
        "cancel": lambda: services.reservation_cancel(reservation=reservation, actor=actor),
        "release": lambda: services.reservation_release(reservation=reservation, actor=actor),
        "extend": lambda: services.reservation_extend(
            reservation=reservation, actor=actor, end=reservation.end + (at(1) - at(0))
        ),
        "approve": lambda: services.reservation_approve(reservation=reservation, actor=actor),
        "reject": lambda: services.reservation_reject(reservation=reservation, actor=actor, reason="no"),
    }
    try:
        with transaction.atomic():
            calls[action]()
            raise _RollBack
    except _RollBack:
        return True
    except BookingError:
        return False


def offered(reservation: Reservation, viewer) -> frozenset[str]:
    reservation = Reservation.objects.get(pk=reservation.pk)
    return reservation_actions(
        reservation=reservation,
        viewer=viewer,
        now=timezone.now(),
        extension_waiting=pending_extension(reservation) is not None,
    )


def _approved(alice, carol, approval_node, clock):
    return book(alice, list(approval_node.gpus.all()), at(1), at(3), actor=carol)


def _pending(alice, carol, approval_node, clock):
    return book(alice, list(approval_node.gpus.all()), at(1), at(3))


def _cancelled(alice, carol, approval_node, clock):
    return services.reservation_cancel(reservation=_approved(alice, carol, approval_node, clock), actor=alice)


def _rejected(alice, carol, approval_node, clock):
    return services.reservation_reject(
        reservation=_pending(alice, carol, approval_node, clock), actor=carol, reason="x"
    )


def _extension_request(alice, carol, approval_node, clock):
    booking = _approved(alice, carol, approval_node, clock)
    services.reservation_extend(reservation=booking, actor=alice, end=at(5))
    return booking.extensions.get()


def _with_waiting_extension(alice, carol, approval_node, clock):
    booking = _approved(alice, carol, approval_node, clock)
    services.reservation_extend(reservation=booking, actor=alice, end=at(5))
    return booking


STATES = {
    "approved": _approved,
    "pending": _pending,
    "cancelled": _cancelled,
    "rejected": _rejected,
    "extension request": _extension_request,
    "with a waiting extension": _with_waiting_extension,
}
# Before, during and after the booking's slot (an extension request's slot is at(3)-at(5)).
MOMENTS = {"before": 0, "during": 2, "during the extension": 4, "after": 6}


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("state", STATES)
def test_what_is_offered_is_what_the_services_accept(state, moment, alice, bob, carol, clock):
    approval_node = node_with_gpus(2, name="gpu-h100", requires_approval=True)
    reservation = STATES[state](alice, carol, approval_node, clock)
    clock.move_to(at(MOMENTS[moment]))

    for viewer in (alice, bob, carol):
        shown = offered(reservation, viewer)
        done = {action for action in ACTIONS if accepted(Reservation.objects.get(pk=reservation.pk), action, viewer)}
        assert shown == done, f"{state}, {moment}, seen by {viewer}: offered {sorted(shown)}, accepted {sorted(done)}"
