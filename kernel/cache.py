"""The portal's cache: Redis, shared by every web process, and forgiving.

It holds the API's and the feeds' rate limits (DRF throttles, feeds/pages.py), which must count the
requests of every web process together: with a cache per process, N processes would allow N times the
rate. A Redis that is away must not turn every request into a 500 either, so a failing call is logged and
answers as an empty cache would (nothing remembered: the limits fail open until Redis is back, as the
rest of the portal carries on without Redis).
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.cache.backends.redis import RedisCache
from redis.exceptions import RedisError

logger = logging.getLogger(__name__)


class ForgivingRedisCache(RedisCache):
    def _forgive(self, operation: str, default: Any) -> Any:
        logger.warning("cache %s failed: Redis is away; carrying on without it", operation, exc_info=True)
        return default

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        try:
            return super().get(key, default, version)
        except RedisError:
            return self._forgive("get", default)

    def set(self, key: Any, value: Any, timeout: Any = None, version: int | None = None) -> None:
        try:
            super().set(key, value, timeout, version)
        except RedisError:
            self._forgive("set", None)

    def add(self, key: Any, value: Any, timeout: Any = None, version: int | None = None) -> bool:
        try:
            return super().add(key, value, timeout, version)
        except RedisError:
            return self._forgive("add", False)

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        try:
            return super().incr(key, delta, version)
        except RedisError:
            return self._forgive("incr", delta)

    def delete(self, key: Any, version: int | None = None) -> bool:
        try:
            return super().delete(key, version)
        except RedisError:
            return self._forgive("delete", False)
