"""What the Slurm link announces, for the apps above it that react (alerts). Sent with ``sender=SlurmCluster``.

- ``controller_unreachable``: a pass could not reach the controller. ``since`` (when it stopped answering),
  ``problem`` (the words of the attempt), ``now``.
- ``controller_reached``: it answered. ``now``.
- ``jobs_read``: jobs of its reservations were read from its accounting. ``reservation_ids``, ``now``.
- ``reservation_refused`` (sender=SlurmReservation): Slurm refused a booking's reservation. ``reservation_id``,
  ``problem`` (Slurm's words), ``now``. Sent when it is refused, and again when Slurm's words change.
- ``reservation_settled`` (sender=SlurmReservation): one refused before is in Slurm now, or no longer wanted (the
  booking was cancelled or ended). ``reservation_id``, ``now``.
"""

from __future__ import annotations

from kernel.signals import PhasedSignal

controller_unreachable = PhasedSignal("slurm_controller_unreachable")
controller_reached = PhasedSignal("slurm_controller_reached")

# The jobs of the portal's reservations were read from the cluster's accounting (slurm/usage.py).
# ``reservation_ids`` (the bookings whose jobs were read), ``now``. accounting counts their usage from them.
jobs_read = PhasedSignal("slurm_jobs_read")

reservation_refused = PhasedSignal("slurm_reservation_refused")
reservation_settled = PhasedSignal("slurm_reservation_settled")
