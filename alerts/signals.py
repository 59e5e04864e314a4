"""What alerts announce: alerts opened or resolved.

alerts sits below live, which shows alerts on the admins' status pages: alerts never calls it, it
sends ``alert_changed`` and live receives it (live/receivers.py). A ``PhasedSignal``
(kernel/signals.py): receivers of ``.on_commit`` run once the change has committed.
"""

from __future__ import annotations

from kernel.signals import PhasedSignal

# Alerts were opened or resolved (sender=Alert). alert_ids: the alerts whose state changed; read them
# after commit (alerts.selectors.alerts_data) for their state as it was committed.
alert_changed = PhasedSignal("alert_changed")
