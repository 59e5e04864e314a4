"""The portal's own Redis client (push marks, sparkline history), one per process.

Short timeouts: Redis is a courtesy here, and a caller that finds it away logs and carries on.
Celery and the channel layer keep their own connections.
"""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def redis_client() -> redis.Redis:
    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2, socket_connect_timeout=2)
