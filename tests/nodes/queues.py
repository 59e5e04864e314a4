"""Reading Celery messages straight out of the Redis broker, to see what the portal really sent."""

from __future__ import annotations

import base64
import json
from typing import Any

import redis
from django.conf import settings


def broker() -> redis.Redis:
    return redis.Redis.from_url(settings.CELERY_BROKER_URL)


def purge(*queues: str) -> None:
    broker().delete(*queues)


def messages(queue: str, task: str | None = None) -> list[dict[str, Any]]:
    """Each message on ``queue`` (of ``task`` only, if given) as {task, args, expires, eta}, oldest first."""
    found = []
    for raw in reversed(broker().lrange(queue, 0, -1)):  # kombu LPUSHes, consumers take from the right
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        headers = message["headers"]
        found.append(
            {"task": headers["task"], "args": args, "expires": headers.get("expires"), "eta": headers.get("eta")}
        )
    return [message for message in found if task is None or message["task"] == task]
