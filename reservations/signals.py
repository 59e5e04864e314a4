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
"""

from __future__ import annotations

from kernel.signals import PhasedSignal

reservation_changed = PhasedSignal("reservation_changed")
