"""How the portal's long-running processes set up the interpreter once their code is loaded."""

from __future__ import annotations

import gc


def freeze_loaded_objects() -> None:
    """Leave every object alive now out of the garbage collections to come (``gc.freeze``).

    A web process or the ingest process loads Django, the apps and their modules once: some 150,000 objects
    that live as long as the process does. Python's collector still walked all of them in every full
    collection, and everything else in the process waited meanwhile: under bench/live.py (500 pages open,
    200 telemetry reports a second) each web process stopped for 100-165 ms many times a minute, which was
    most of the slowest reports' time to the pages. Frozen, those pauses take 20-60 ms (docs/operations.md,
    issue 20's ninth step). Objects made later are collected as before; the frozen ones were never garbage.
    Call it once, when the process has loaded what it serves with.
    """
    gc.collect()
    gc.freeze()
