"""API pagination."""

from __future__ import annotations

from typing import Any

from rest_framework.pagination import LimitOffsetPagination


class Pagination(LimitOffsetPagination):
    """limit/offset pages. Both are clamped: a huge number must not reach the database as an overflow."""

    default_limit = 100
    max_limit = 1000
    max_offset = 10**9

    def get_offset(self, request: Any) -> int:
        return min(super().get_offset(request), self.max_offset)
