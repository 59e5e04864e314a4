"""API throttling. Kept apart from kernel/api.py: DRF imports this while defining its views."""

from __future__ import annotations

from typing import Any

from rest_framework.throttling import UserRateThrottle


class TokenRateThrottle(UserRateThrottle):
    """Rate per API token (a script's key), per user for browser sessions."""

    scope = "user"

    def get_cache_key(self, request: Any, view: Any) -> str | None:
        token = getattr(request, "auth", None)
        if token is not None and getattr(token, "pk", None):
            return self.cache_format % {"scope": self.scope, "ident": f"token-{token.pk}"}
        return super().get_cache_key(request, view)
