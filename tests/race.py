"""Truly simultaneous attempts on PostgreSQL (pretix style): each in a thread with its own database connection,
all released at once by a barrier. The concurrency tests of bookings, series, reserved capacity and the waitlist
use it; each says what its attempts do and which refusals it expects."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from django.db import connection

Attempt = Callable[[], str]


def at_once(attempts: Sequence[Attempt], *, refusals: Mapping[type[Exception], str], timeout: float = 60) -> Counter:
    """Run ``attempts`` together; count their outcomes: what an attempt returns, the word ``refusals`` gives the
    exception it raised (the first class that matches), or "error: ..." for anything else."""
    barrier = threading.Barrier(len(attempts))
    outcomes: Counter = Counter()
    lock = threading.Lock()

    def run(attempt: Attempt) -> None:
        try:
            barrier.wait()
            result = attempt()
        except tuple(refusals) as exc:
            result = next(word for kind, word in refusals.items() if isinstance(exc, kind))
        except Exception as exc:
            result = f"error: {exc!r}"
        finally:
            connection.close()
        with lock:
            outcomes[result] += 1

    threads = [threading.Thread(target=run, args=(attempt,)) for attempt in attempts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout)
    return outcomes
