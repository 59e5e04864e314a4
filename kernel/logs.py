"""Structured logs: one JSON object per line when LOG_FORMAT=json (settings.LOGGING).

Each line has ``time`` (ISO 8601, UTC), ``level``, ``logger`` and ``message``, then whatever the
record carries: a traceback as ``exc_info``, a request's ``method``, ``path`` and ``status_code``
(Django's request and server loggers attach the request), and the Celery task's ``task_id`` and
``task_name`` inside a worker. Anything passed as ``extra=`` is kept as its own key.

``RedactSecrets`` (a filter on the one console handler, so on every line whatever its format or
logger) takes secrets out of what is written: the MAC of calendar feed URLs (feeds.tokens), which
Django's request logger writes on a 404, daphne's access log on every fetch (portal/serve.py sends
it through logging), and any traceback or ``extra=`` value might.

A secret may be spelled in percent escapes (``/%66eeds/…``, ``/feeds%2F…``, ``%2e`` for a dot, even
``%252e`` twice over): the web server decodes the path before the portal routes it, so such a URL
is answered like the plain one while the access log keeps the spelling the client sent. So each
word of a line that holds an escape is also decoded (a few rounds, as far as it changes) and looked
at again; where that finds a secret, the word is written decoded, redacted, and escaped again (so a
decoded newline or quote never reaches the log as one). A word with escapes longer than any request line a web
server accepts is written as its length alone: what a client sends never makes a line costly to redact.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, unquote

from celery import current_task
from django.http import HttpRequest
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _JsonFormatter

# Django attaches the request object (and the dev server its own clock); neither is JSON.
_NOT_FIELDS = [*RESERVED_ATTRS, "request", "server_time"]


# What each app knows to be secret in a log line (feeds: the MACs in feed URLs), added by the app's
# AppConfig.ready(): the kernel knows no app, and requests are logged only once the apps are ready.
_REDACTORS: list[Callable[[str], str]] = []


def register_redactor(redact: Callable[[str], str]) -> None:
    if redact not in _REDACTORS:
        _REDACTORS.append(redact)


def redact_secrets(text: str) -> str:
    """``text`` as it may be logged: every secret the portal knows to look for replaced, in whatever
    percent-encoded spelling it comes."""
    if "%" in text:  # first, so that a secret is found whole, before a plain pass cuts an escape apart
        text = _ENCODED_WORD.sub(_redact_encoded_word, text)
    return _redact_plain(text)


def _redact_plain(text: str) -> str:
    for redact in _REDACTORS:
        text = redact(text)
    return text


# A word of a log line (a path, a URL, a query) holding at least one percent escape, in either case of hex. It
# begins where a word begins (the lookbehind): a match tried from every character of a long word that holds no
# escape would scan the rest of that word each time, so a client's 32 KB path of "%zz" cost seconds of the web
# worker's time, twice a request, where anchored it costs one scan (tests/feeds/test_access_logs.py).
_ENCODED_WORD = re.compile(r"(?<![^\s\"'<>])[^\s\"'<>]*%[0-9A-Fa-f]{2}[^\s\"'<>]*")
# No request line a web server accepts is this long (gunicorn's limit is 4094 bytes, h11's 16 KB with the headers):
# a longer word with escapes is somebody's probe, written as its length alone rather than decoded and looked at, so
# what a line costs to redact stays small whatever a client sends.
_LONGEST_DECODED_WORD = 8192
# daphne and uvicorn decode a path once; a second round catches what a proxy in front may have decoded first,
# the third is to spare. Each round that changes nothing ends it.
_DECODE_ROUNDS = 3
# What stays as it is when a decoded, redacted word is escaped again: a URL's own punctuation and the brackets
# of "[redacted]"; whitespace, quotes, control characters and % are escaped.
_URL_PUNCTUATION = "/:?#[]@!$&()*+,;=~"


def _redact_encoded_word(match: re.Match[str]) -> str:
    word = decoded = match[0]
    if len(word) > _LONGEST_DECODED_WORD:
        return f"[redacted: {len(word)} characters with percent escapes]"
    for _ in range(_DECODE_ROUNDS):
        once = unquote(decoded, errors="replace")
        if once == decoded:
            break
        decoded = once
    redacted = _redact_plain(decoded)
    if redacted == decoded:
        return word  # nothing secret in it: the spelling the client sent, for whoever reads the log
    return quote(redacted, safe=_URL_PUNCTUATION)


class RedactSecrets(logging.Filter):
    """Redacts the message (after formatting its arguments), every string ``extra=`` value, the
    traceback and the stack. Never drops a record, and never fails one: a record whose message cannot
    be formatted goes on as it is, for the handler to report as usual."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:
            return True
        redacted = redact_secrets(message)
        if redacted != message:
            record.msg, record.args = redacted, ()
        for key, value in list(vars(record).items()):
            if key not in RESERVED_ATTRS and isinstance(value, str):
                setattr(record, key, redact_secrets(value))
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_secrets(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_secrets(record.stack_info)
        return True


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
            log_data["path"] = redact_secrets(request.path)
        task = current_task  # the task this worker thread is running, if any
        if task and task.request.id:
            log_data["task_id"] = task.request.id
            log_data["task_name"] = task.name

    def formatException(self, ei: Any) -> str:
        # The JSON formatter formats the traceback itself rather than using the filter's exc_text.
        # It gives a list of lines only with exc_info_as_array, which __init__ leaves off.
        formatted = super().formatException(ei)
        return redact_secrets(formatted if isinstance(formatted, str) else "\n".join(formatted))
