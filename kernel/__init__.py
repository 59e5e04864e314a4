"""The shared kernel: small helpers every app may use (environment settings, locks, the Redis client,
form and API fields, pagination, throttling, API error handling, log formatting).

The bottom layer (docs/architecture.md): it imports Django, DRF and the standard library, never an app
of the portal, so any app can import it without closing a loop.
"""
