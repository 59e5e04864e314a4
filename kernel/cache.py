"""The portal's cache: Redis, shared by every web process, and forgiving.

It holds the API's and the feeds' rate limits (DRF throttles, feeds/pages.py), which must count the
requests of every web process together: with a cache per process, N processes would allow N times the
rate. A Redis that is away must not turn every request into a 500 either, so a failing call answers as an
empty cache would (nothing remembered: the limits fail open until Redis is back, as the rest of the portal
carries on without Redis), and the cache leaves Redis alone for ``PAUSE_SECONDS``: a Redis that does not
answer would otherwise add its timeout to every request, and a traceback to the log for each.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from django.core.cache.backends.redis import RedisCache
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


class ForgivingRedisCache(RedisCache):
    PAUSE_SECONDS = 30.0

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._paused_until = 0.0

    def _forgiving(self, operation: str, default: Any, call: Callable[[], Any]) -> Any:
        if time.monotonic() < self._paused_until:
            return default
        try:
            return call()
        except RedisError:
            self._paused_until = time.monotonic() + self.PAUSE_SECONDS
            logger.warning(
                "cache %s failed: Redis is away; rate limits are off for the next %d s",
                operation,
                self.PAUSE_SECONDS,
                exc_info=True,
            )
            return default

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        return self._forgiving("get", default, lambda: super(ForgivingRedisCache, self).get(key, default, version))

    def set(self, key: Any, value: Any, timeout: Any = None, version: int | None = None) -> None:
        self._forgiving("set", None, lambda: super(ForgivingRedisCache, self).set(key, value, timeout, version))

    def add(self, key: Any, value: Any, timeout: Any = None, version: int | None = None) -> bool:
        return bool(
            self._forgiving("add", False, lambda: super(ForgivingRedisCache, self).add(key, value, timeout, version))
        )

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        return int(self._forgiving("incr", delta, lambda: super(ForgivingRedisCache, self).incr(key, delta, version)))

    def delete(self, key: Any, version: int | None = None) -> bool:
        return bool(self._forgiving("delete", False, lambda: super(ForgivingRedisCache, self).delete(key, version)))
