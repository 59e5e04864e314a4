"""/metrics for Prometheus: the fleet's telemetry, agents and bookings, read from the database at
scrape time (docs/metrics.md)."""
