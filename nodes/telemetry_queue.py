"""Telemetry off the request path: the web process queues a report, a consumer stores them in batches.

With TELEMETRY_INGEST=queue (the default), the telemetry endpoint validates a report, appends it to a
Redis stream and answers; ``manage.py consume_telemetry`` (the "ingest" process of the Procfile and
of docker-compose.yml) takes every report waiting, up to TELEMETRY_BATCH_REPORTS, and stores them
with ``telemetry_batch_record`` in one transaction: the same code, and the same results, as a report
stored by the web process (TELEMETRY_INGEST=inline), in a handful of statements per batch instead of
per report.

Nothing is lost or counted twice:
- The stream is read from the consumer's mark (``IngestMark``), the id of the last entry whose writes
  committed, and the mark moves in the same transaction as those writes. A consumer that dies before
  its commit has written nothing and the next one reads the same entries again; one that dies after
  its commit left the mark past them. (A consumer group's acknowledgement, sent after the commit,
  would still count a batch twice when the process dies between the two.)
- Entries are trimmed from the stream only once their mark has committed.
- Two consumers at once are safe: the mark row is locked for the batch, and a mark that moved under
  a consumer anyway (SQLite takes no row lock) rolls its batch back.
- Entries are stored in the stream's order, so each GPU's readings stay in order.

A portal that falls behind by TELEMETRY_QUEUE_MAX reports answers 503 with Retry-After instead of
growing the queue without bound; the agent sends its next report as usual.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import close_old_connections, transaction

from kernel.redis_client import redis_client
from nodes.ingest import telemetry_batch_record
from nodes.models import IngestMark, Node

logger = logging.getLogger(__name__)

STREAM = "gpubook:telemetry"
WAIT_MS = 500  # an idle consumer wakes this often to see whether it should stop (under the client's 2 s timeout)


class QueueFull(Exception):
    """The consumer is TELEMETRY_QUEUE_MAX reports behind: the report is refused, not queued."""


class MarkMoved(Exception):
    """Another consumer stored these entries meanwhile: this batch rolls back."""


def telemetry_enqueue(*, node: Node, samples: list[dict[str, Any]], now: datetime) -> None:
    """Queue one validated report of ``node``, received at ``now``."""
    client = redis_client()
    if client.xlen(STREAM) >= settings.TELEMETRY_QUEUE_MAX:
        raise QueueFull
    client.xadd(STREAM, {"report": json.dumps([node.pk, now.isoformat(), samples])})


def telemetry_consume(*, limit: int | None = None) -> int:
    """Store the reports waiting after the mark (at most ``limit``, default TELEMETRY_BATCH_REPORTS) in one
    transaction; returns how many entries were taken (0: none waiting)."""
    client = redis_client()
    with transaction.atomic():
        mark, _ = IngestMark.objects.select_for_update().get_or_create(stream=STREAM)
        after = f"({mark.last_id}" if mark.last_id else "-"
        entries = client.xrange(STREAM, min=after, count=limit or settings.TELEMETRY_BATCH_REPORTS)
        if not entries:
            return 0
        telemetry_batch_record([_decode(fields) for _, fields in entries])
        last_id = _text(entries[-1][0])
        if not IngestMark.objects.filter(stream=STREAM, last_id=mark.last_id).update(last_id=last_id):
            raise MarkMoved(f"the mark of {STREAM} moved from {mark.last_id or 'nothing'} during a batch")
    _trim(client, last_id)
    return len(entries)


def telemetry_backlog() -> int:
    """Reports queued and not yet stored (entries a consumer stored and could not trim are trimmed first)."""
    client = redis_client()
    mark = IngestMark.objects.filter(stream=STREAM).values_list("last_id", flat=True).first()
    if mark:
        _trim(client, mark)
    return int(client.xlen(STREAM))


def _trim(client: Any, last_id: str) -> None:
    """Drop the entries up to ``last_id`` (XTRIM MINID keeps the id it is given: the next one is given)."""
    ms, _, sequence = last_id.partition("-")
    client.xtrim(STREAM, minid=f"{ms}-{int(sequence) + 1}", approximate=False)


def telemetry_consume_forever(stop: threading.Event) -> None:
    """The consumer's loop: store batches as long as reports wait, else wait for the next one (a
    blocking read, no polling). A batch that did not fill up means the queue is caught up: the next one
    gathers until TELEMETRY_BATCH_WAIT_MS after this one began, so a steady stream is stored a few
    batches a second rather than a report at a time, while a report after a quiet spell goes at once.
    A failing batch is logged and retried after a pause; ``stop`` ends the loop between batches."""
    client = redis_client()
    while not stop.is_set():
        began = time.monotonic()
        try:
            taken = telemetry_consume()
            if taken:
                if taken < settings.TELEMETRY_BATCH_REPORTS:
                    stop.wait(max(0.0, began + settings.TELEMETRY_BATCH_WAIT_MS / 1000 - time.monotonic()))
                continue
            mark = IngestMark.objects.filter(stream=STREAM).values_list("last_id", flat=True).first()
            client.xread({STREAM: mark or "0"}, count=1, block=WAIT_MS)
        except MarkMoved:
            logger.info("another telemetry consumer stored a batch first; reading on from its mark")
        except Exception:
            logger.exception("telemetry batch not stored; trying again in a second")
            close_old_connections()  # a connection the database dropped is opened again
            stop.wait(1.0)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _decode(fields: Any) -> tuple[int, list[dict[str, Any]], datetime]:
    node_id, at, samples = json.loads(fields[b"report"])
    return node_id, samples, datetime.fromisoformat(at)
