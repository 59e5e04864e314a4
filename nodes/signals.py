"""What nodes announce: reports stored, nodes gone silent or back, GPUs drained or returned.

nodes sits below reservations and the apps that react (alerts, live): it never calls them, it sends
these and they receive (docs/architecture.md, "Signals"). Each is a ``PhasedSignal``: receivers of
``.in_transaction`` run at once, inside the report's transaction where there is one (alerts write
their rows there); receivers of ``.on_commit`` run once it has committed (live broadcasts).

All are sent with ``sender=Node`` (or ``Gpu``) and keyword arguments only:
"""

from __future__ import annotations

from kernel.signals import PhasedSignal

# A heartbeat was stored. node, now; ``cards_changed``: the node came back from silence or its
# drained GPUs changed, so its status cards differ (telemetry refreshes them otherwise); ``launches``: the
# environments the agent runs or ran, as it reports them (protocol.LaunchStatus, validated; environments records
# them).
node_reported = PhasedSignal("node_reported")

# Telemetry was stored: ``reports``, oldest first (nodes.ingest.TelemetryReport: node, readings (one
# GpuTelemetry row per GPU), now, ``came_back``: the node was silent before, every card changes). One
# report when the web process stores it, all those of a batch when the telemetry consumer does (then
# ``queued`` is true: such batches come TELEMETRY_BATCH_WAIT_MS apart at most once each, already spaced).
telemetry_received = PhasedSignal("telemetry_received")

# Agent events were stored. node, ``stored`` (NodeEvent rows written), ``acting`` (those that open or
# resolve alerts, including some past the node's event budget that were not stored), now.
node_events_recorded = PhasedSignal("node_events_recorded")

# Nodes silent for AGENT_OFFLINE_AFTER_SECONDS were just marked offline. node_ids, now.
nodes_went_offline = PhasedSignal("nodes_went_offline")

# A node marked offline reported again. node, now.
node_back_online = PhasedSignal("node_back_online")

# A GPU was taken out of booking (sender=Gpu). gpu, reason, actor (None: the agent's report).
gpu_drained = PhasedSignal("gpu_drained")

# An admin returned a drained GPU to service (sender=Gpu). gpu, actor.
gpu_returned = PhasedSignal("gpu_returned")

# An admin changed a node's idle power cap (Node.idle_power_limit_pct). node, actor. It reaches the agent in
# the node's snapshot: reservations pushes one at once rather than at beat's next minute.
node_power_policy_changed = PhasedSignal("node_power_policy_changed")

# MIG slices its agent no longer reports were taken out of booking (nodes/mig.py). node, gpu_ids (the
# slices), now. Bookings that name them are flagged and their holders told (alerts).
mig_slices_gone = PhasedSignal("mig_slices_gone")

# A card's agent reported a MIG mode or card numbers (compute or memory slices) that differ from the confirmed
# ones (nodes/mig.py), sender=Gpu: the card and its slices wait, not bookable, until an admin confirms. card,
# confirmed and reported (nodes.mig.CardLayout), now. Sent again when the waiting layout changes; a heartbeat
# that repeats it sends nothing. Alerts opens one alert per card while it waits.
mig_layout_changed = PhasedSignal("mig_layout_changed")

# An admin confirmed a card's MIG layout (nodes/mig.py, mig_layout_confirm), sender=Gpu. card, actor.
mig_layout_confirmed = PhasedSignal("mig_layout_confirmed")
