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
- A report the database refuses (a value out of a column's range that validation let through, say) does
  not hold up the others: the batch is stored again a report at a time, and that one is logged and
  passed over. A database that is away fails the whole batch, which is tried again.
- A stream that was made again behind the mark (Redis restarted without its data while its clock went
  back) is read from its start, with a warning, rather than waited on.
What Redis itself loses is lost: a Redis restarted without persistence (the demo's and docker-compose's)
drops the reports queued at that moment, normally a fraction of a second's worth; each node's next
report follows within seconds. Needs Redis 6.2 or later (exclusive XRANGE bounds, XTRIM MINID).

A portal that falls behind by TELEMETRY_QUEUE_MAX reports, or whose queue holds TELEMETRY_QUEUE_MAX_MB,
answers 503 with Retry-After instead of growing the queue without bound; the agent sends its next
report as usual. With Redis away the web process stores the report itself (``QueueAway``).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import datetime
from typing import Any

import redis
from django.conf import settings
from django.db import DataError, IntegrityError, close_old_connections, transaction

from kernel.redis_client import redis_client
from nodes.ingest import telemetry_batch_record
from nodes.models import IngestMark, Node

logger = logging.getLogger(__name__)

STREAM = "gpubook:telemetry"
WAIT_MS = 500  # an idle consumer wakes this often to see whether it should stop (under the client's 2 s timeout)
PAUSE_SECONDS = 30.0
# The database refusing one report's values; anything else (a database away, a bug) fails the whole batch.
REFUSED = (DataError, IntegrityError, ValueError, TypeError, KeyError)
_paused_until = 0.0


class QueueFull(Exception):
    """The consumer is TELEMETRY_QUEUE_MAX reports (or TELEMETRY_QUEUE_MAX_MB) behind: the report is
    refused, not queued."""


class QueueAway(Exception):
    """Redis did not answer (or did recently): the caller stores the report itself."""


class MarkMoved(Exception):
    """Another consumer stored these entries meanwhile: this batch rolls back."""


def telemetry_enqueue(*, node: Node, samples: list[dict[str, Any]], now: datetime) -> None:
    """Queue one validated report of ``node``, received at ``now``. Raises QueueFull past the limits, and
    QueueAway when Redis fails (then leaves it alone for PAUSE_SECONDS, as the cache does)."""
    global _paused_until
    if time.monotonic() < _paused_until:
        raise QueueAway
    try:
        queued = redis_client().register_script(_ENQUEUE)(  # sent by its digest; loaded again if Redis forgot it
            keys=[STREAM],
            args=[
                settings.TELEMETRY_QUEUE_MAX,
                settings.TELEMETRY_QUEUE_MAX_MB * 2**20,
                json.dumps([node.pk, now.isoformat(), samples]),
            ],
        )
    except redis.RedisError as exc:
        _paused_until = time.monotonic() + PAUSE_SECONDS
        if isinstance(exc, redis.exceptions.NoPermissionError):
            logger.error(
                "telemetry not queued: the portal's Redis user may not run EVALSHA and EVAL (%s; docs/agent.md, "
                "'The broker'); web processes store it for the next %d s",
                exc,
                PAUSE_SECONDS,
            )
        else:
            logger.warning(
                "telemetry not queued: Redis is away; web processes store it for the next %d s", PAUSE_SECONDS
            )
        raise QueueAway from exc
    if not queued:
        raise QueueFull


# The limits checked and the report added in one step, in one round trip: a web process waits on Redis once
# per report (while it waits, its event loop may take the interpreter for the pages' messages), and two web
# processes cannot both pass the check with the last free place. MEMORY USAGE estimates from a few entries.
_ENQUEUE = """
local length = redis.call('XLEN', KEYS[1])
local size = redis.call('MEMORY', 'USAGE', KEYS[1], 'SAMPLES', 5) or 0
if length >= tonumber(ARGV[1]) or size >= tonumber(ARGV[2]) then
    return 0
end
redis.call('XADD', KEYS[1], '*', 'report', ARGV[3])
return 1
"""


def telemetry_consume(*, limit: int | None = None) -> int:
    """Store the reports waiting after the mark (at most ``limit``, default TELEMETRY_BATCH_REPORTS) in one
    transaction; returns how many entries were taken (0: none waiting)."""
    client = redis_client()
    with transaction.atomic():
        mark, _ = IngestMark.objects.select_for_update().get_or_create(stream=STREAM)
        after = f"({mark.last_id}" if mark.last_id else "-"
        entries = client.xrange(STREAM, min=after, count=limit or settings.TELEMETRY_BATCH_REPORTS)
        if not entries:
            _restart_behind(client, mark)
            return 0
        _store(entries)
        last_id = _text(entries[-1][0])
        if not IngestMark.objects.filter(stream=STREAM, last_id=mark.last_id).update(last_id=last_id):
            raise MarkMoved(f"the mark of {STREAM} moved from {mark.last_id or 'nothing'} during a batch")
    try:
        _trim(client, last_id)
    except redis.RedisError:  # stored all the same; the next batch or telemetry_backlog trims them
        logger.warning("telemetry stored up to %s, not trimmed from the queue yet", last_id, exc_info=True)
    return len(entries)


def _store(entries: list[Any]) -> None:
    """The entries' reports, together; if the database refuses the batch, one at a time, passing over
    (and logging) those it refuses on their own, and any entry that cannot be read. Each try is a
    savepoint: what a refused one wrote, and what it would have done after commit, goes with it."""
    reports = []
    for entry_id, fields in entries:
        try:
            reports.append((_text(entry_id), _decode(fields)))
        except (ValueError, KeyError, TypeError):
            logger.exception("telemetry entry %s cannot be read: passed over", _text(entry_id))
    try:
        with transaction.atomic():
            telemetry_batch_record([report for _, report in reports], queued=True)
        return
    except REFUSED:
        logger.warning("the database refused a batch of %d telemetry reports: storing them one by one", len(reports))
    for entry_id, report in reports:
        try:
            with transaction.atomic():
                telemetry_batch_record([report])  # one by one: the pages' own batching spaces them
        except REFUSED:
            logger.exception("telemetry report %s of node %s refused by the database: passed over", entry_id, report[0])


def _restart_behind(client: Any, mark: IngestMark) -> None:
    """Nothing after the mark: if the stream's newest id is older than the mark, the stream was made again
    (Redis restarted without its data, its clock behind the one that made the mark). Read it from its
    start rather than wait for the clock to catch up."""
    if not mark.last_id:
        return
    newest = _newest_id(client)
    if newest is not None and _id(newest) < _id(mark.last_id):
        logger.warning(
            "telemetry queue made again behind its mark (%s < %s): read from its start", newest, mark.last_id
        )
        IngestMark.objects.filter(stream=STREAM).update(last_id="")


def telemetry_backlog() -> int:
    """Reports queued and not yet stored (entries a consumer stored and could not trim are trimmed first)."""
    client = redis_client()
    mark = _stored_up_to()
    if mark:
        newest = _newest_id(client)
        if newest is None:  # no stream
            return 0
        if _id(mark) <= _id(newest):  # never trim a stream made again behind the mark
            _trim(client, mark)
    return int(client.xlen(STREAM))


def _stored_up_to() -> str:
    """The mark, read without a lock: the id of the last entry stored ("": none yet)."""
    return IngestMark.objects.filter(stream=STREAM).values_list("last_id", flat=True).first() or ""


def _newest_id(client: Any) -> str | None:
    """The id the stream last gave an entry (None: there is no stream)."""
    try:
        return _text(client.xinfo_stream(STREAM)["last-generated-id"])
    except redis.ResponseError:
        return None


def _id(entry_id: str) -> tuple[int, int]:
    ms, _, sequence = entry_id.partition("-")
    return int(ms), int(sequence or 0)


def _trim(client: Any, last_id: str) -> None:
    """Drop the entries up to ``last_id`` (XTRIM MINID keeps the id it is given: the next one is given)."""
    ms, sequence = _id(last_id)
    client.xtrim(STREAM, minid=f"{ms}-{sequence + 1}", approximate=False)


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
            client.xread({STREAM: _stored_up_to() or "0"}, count=1, block=WAIT_MS)
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
