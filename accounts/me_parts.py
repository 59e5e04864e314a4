"""Fields that apps above accounts add to ``GET /api/v1/me/`` (fairshare's ``fair_share`` today).

``MeSerializer`` (accounts/serializers.py) describes the payload and reservations/me.py builds it; neither
may import the apps above them. Such an app registers, in its ``AppConfig.ready()``, a name, the serializer
class of its value (for the OpenAPI schema and the output) and ``read(user=..., now=...)`` giving the value.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rest_framework import serializers


@dataclass(frozen=True)
class MePart:
    name: str
    serializer: type[serializers.Serializer]
    read: Callable[..., Any]


class MeParts:
    def __init__(self) -> None:
        self._parts: dict[str, MePart] = {}

    def register(self, name: str, serializer: type[serializers.Serializer], read: Callable[..., Any]) -> None:
        self._parts[name] = MePart(name, serializer, read)  # replaces: ready() may run twice in tests

    def fields(self) -> dict[str, serializers.Serializer]:
        return {part.name: part.serializer() for part in self._parts.values()}

    def read(self, *, user: Any, now: datetime) -> dict[str, Any]:
        return {part.name: part.read(user=user, now=now) for part in self._parts.values()}


me_parts = MeParts()
