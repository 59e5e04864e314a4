"""The last minutes of each GPU's utilisation, for the status page's sparklines.

A short Redis list per GPU (the newest HISTORY_SAMPLES readings, gone after HISTORY_TTL of
silence): the page's first paint draws from it, and live updates append to it in the browser.
Down-sampled history for reports is another matter, kept in the database. Losing this loses
nothing but a few minutes of a small line, so a Redis failure is logged and ignored.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime

import redis

from kernel.redis_client import redis_client

logger = logging.getLogger(__name__)

KEY = "gpubook:utilization:{gpu_id}"
HISTORY_SAMPLES = 120  # ten minutes at the agents' 5 s
HISTORY_TTL = 900


def history_record(readings: Iterable[tuple[int, datetime, int | None]]) -> None:
    """Append (GPU id, time, utilisation %) readings, in order; those without a utilisation are skipped.
    One append, trim and expiry per GPU, however many of its readings come at once."""
    points: dict[int, list[str]] = {}
    for gpu_id, at, utilization in readings:
        if utilization is not None:
            points.setdefault(gpu_id, []).append(f"{int(at.timestamp() * 1000)},{utilization}")
    if not points:
        return
    try:
        pipe = redis_client().pipeline(transaction=False)
        for gpu_id, values in points.items():
            key = KEY.format(gpu_id=gpu_id)
            pipe.rpush(key, *values[-HISTORY_SAMPLES:])
            pipe.ltrim(key, -HISTORY_SAMPLES, -1)
            pipe.expire(key, HISTORY_TTL)
        pipe.execute()
    except redis.RedisError:
        logger.warning("utilisation history not recorded (Redis)", exc_info=True)


def history_of(gpu_ids: list[int]) -> dict[int, list[list[int]]]:
    """GPU id -> [[ms since the epoch, utilisation %], ...], oldest first."""
    try:
        pipe = redis_client().pipeline(transaction=False)
        for gpu_id in gpu_ids:
            pipe.lrange(KEY.format(gpu_id=gpu_id), 0, -1)
        lists = pipe.execute()
    except redis.RedisError:
        logger.warning("utilisation history not read (Redis)", exc_info=True)
        return {}
    history = {}
    for gpu_id, items in zip(gpu_ids, lists, strict=True):
        points = []
        for item in items:
            ms, _, value = item.decode().partition(",")
            points.append([int(ms), int(value)])
        history[gpu_id] = points
    return history


def forget_all() -> None:
    """Drop every GPU's history (tests, and a database restored from a backup)."""
    client = redis_client()
    keys = list(client.scan_iter(match=KEY.format(gpu_id="*"), count=1000))
    if keys:
        client.delete(*keys)
