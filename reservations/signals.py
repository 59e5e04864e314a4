"""What the booking domain announces, for the apps above it to react (docs/architecture.md, "Signals").

``reservation_changed`` is sent by every state change of the booking service (reservations/services.py,
``_changed``), inside the change's transaction, with ``sender=Reservation`` and:

- ``reservation``: the booking as it now is;
- ``verb``: what happened (create, approve, reject, cancel, release, extend, extend_request, ...);
- ``mail_verb``: the mails it calls for, when they differ from ``verb`` (else ``verb``);
- ``actor``: who did it (None: the system); ``reason``: the reason given, or "";
- ``before`` / ``after``: the booking's audited snapshot before (None for a new one) and after;
- ``touched_start`` / ``touched_end``: the period the change touched, old and new slot together (ISO,
  UTC), which calendars re-read.

In the transaction: the audit record (reservations/receivers.py) and the mails, written to the outbox
(notifications/receivers.py). Once committed: the node's lease push (reservations/receivers.py), the
status cards and the calendar broadcasts (live/receivers.py).

``reserved_capacity_released`` is sent once per occurrence of reserved capacity (reservations/reserved.py) when
its release time has passed, by the beat task ``reservations.release_reserved_capacity``
(reservations/reserved_release.py), with ``sender=ReservedCapacity`` and:

- ``reserved``: the ReservedCapacity row; ``node``: its node (None for a count of a model on any node);
- ``model``: the GPU model its count is of, or "";
- ``gpu_ids``: the GPUs it kept (the ids of the cards or slices), or ``[]`` for "any N GPUs" (``count`` is
  then N);
- ``count``: N, or None for named GPUs;
- ``start`` / ``end``: the freed occurrence (aware, UTC), which anyone may now book.

In the transaction that records the release (ReservedRelease, unique per occurrence); once committed, what
frees time for others reacts (the waitlist).

``capacity_freed`` is sent (reservations/freed.py) when a booking change frees time: a booking or offer
cancelled or rejected (what is left of its slot), a running one released (the rest of it); inside a series
edit, at its end, for what it did not book again. With ``sender=Reservation`` and ``node``, ``gpu_ids`` (the
units freed), ``start``, ``end`` (aware). The waitlist offers it in the same transaction.
"""

from __future__ import annotations

from kernel.signals import PhasedSignal

reservation_changed = PhasedSignal("reservation_changed")
reserved_capacity_released = PhasedSignal("reserved_capacity_released")
capacity_freed = PhasedSignal("capacity_freed")
