"""Structured logs: one JSON object per line when LOG_FORMAT=json (settings.LOGGING).

Each line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, then whatever the
record carries: a traceback as ``exc_info``, a request's ``method``, ``path`` and ``status_code``
(Django's request and server loggers attach the request), and the Celery task's ``task_id`` and
``task_name`` inside a worker. Anything passed as ``extra=`` is kept as its own key.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from celery import current_task
from django.http import HttpRequest
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

# Django attaches the request object (and the dev server its own clock); neither is JSON.
_NOT_FIELDS = [*RESERVED_ATTRS, "request", "server_time"]


class JsonFormatter(_JsonFormatter):
    def __init__(self) -> None:
        super().__init__("%(message)s", reserved_attrs=_NOT_FIELDS, json_ensure_ascii=False)

    def add_fields(self, log_data: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]) -> None:
        log_data["time"] = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        log_data["level"] = record.levelname
        log_data["logger"] = record.name
        super().add_fields(log_data, record, message_dict)
        request = getattr(record, "request", None)
        if isinstance(request, HttpRequest):
            log_data["method"] = request.method
            log_data["path"] = request.path
        task = current_task  # the task this worker thread is running, if any
        if task and task.request.id:
            log_data["task_id"] = task.request.id
            log_data["task_name"] = task.name
