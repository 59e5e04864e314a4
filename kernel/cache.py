"""The portal's cache: Redis, shared by every web process, and forgiving.

It holds the API's and the feeds' rate limits (DRF throttles, feeds/pages.py), which must count the
requests of every web process together: with a cache per process, N processes would allow N times the
rate. A Redis that is away must not turn every request into a 500 either, so a failing call answers as an
empty cache would (nothing remembered: the limits fail open until Redis is back, as the rest of the portal
carries on without Redis), and the cache leaves Redis alone for ``PAUSE_SECONDS``: a Redis that does not
answer would otherwise add its timeout to every request, and a traceback to the log for each.

Django makes a cache object per thread and, under ASGI, per request, and each would open its own pool
of connections to Redis: a new connection (and a pause that nobody else sees) per API request. Every
cache object of a process shares one client, with its pool and its pause, instead.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from functools import cached_property
from typing import Any

from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)

_clients: dict[str, RedisCacheClient] = {}
_paused_until: dict[str, float] = {}
_lock = threading.Lock()


class ForgivingRedisCache(RedisCache):
    PAUSE_SECONDS = 30.0

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._shared = repr((server, sorted(params.get("OPTIONS", {}).items())))

    @cached_property
    def _cache(self) -> RedisCacheClient:
        with _lock:
            if self._shared not in _clients:
                _clients[self._shared] = super()._cache  # made as Django makes it, once
            return _clients[self._shared]

    def _forgiving(self, operation: str, default: Any, call: Callable[[], Any]) -> Any:
        if time.monotonic() < _paused_until.get(self._shared, 0.0):
            return default
        try:
            return call()
        except RedisError:
            _paused_until[self._shared] = time.monotonic() + self.PAUSE_SECONDS
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
