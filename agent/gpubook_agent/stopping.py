"""The signals that stop the agent, and what they do at each stage of its life (and SIGUSR1, which only shows it).

Before the worker runs (and after it, while the agent shuts down) the agent's own handlers are in force: until the
shut-down begins a stop signal raises ``AgentStopping`` in the main thread, so the ``finally`` that takes every grant
back runs even for a signal that comes during the start; once it has begun, further stop signals are only logged, so
that a second Ctrl-C or a repeated ``kill`` cannot cut the revocation short. While the worker runs, its own
handlers (``worker.make_worker``) stop it warmly, and the same shut-down follows.

SIGHUP stops the agent like SIGTERM: Celery's default for it (re-executing the process from an ``atexit`` hook)
would skip the shut-down, and a terminal that closes must not leave GPUs open. Handlers, never ``SIG_IGN``: an
ignored signal would be inherited by every process the agent starts while it stops (``podman stop``, setfacl).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import traceback
from types import FrameType

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


class AgentStopping(Exception):
    """A stop signal arrived before the worker ran; the message names it."""


def stop_signals_raise() -> None:
    """Until the worker installs its own handlers: a stop signal raises AgentStopping in the main thread."""

    def stop(signum: int, _frame: FrameType | None) -> None:
        raise AgentStopping(f"{signal.Signals(signum).name} received")

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop)


def stop_signals_ignored() -> None:
    """While the agent shuts down: a stop signal is logged and changes nothing."""

    def already_stopping(signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        log.warning("%s received while stopping: the agent is taking its grants back first", name)

    for sig in STOP_SIGNALS:
        signal.signal(sig, already_stopping)


def threads_shown_on_sigusr1() -> None:
    """SIGUSR1 logs every thread's stack, by name, and changes nothing (Celery's meaning for it; the default action
    would end the agent, and without a revocation)."""

    def show(signum: int, _frame: FrameType | None) -> None:
        names = {thread.ident: thread.name for thread in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            stack = "".join(traceback.format_stack(frame))
            log.warning("thread %s (%s):\n%s", names.get(ident, "?"), ident, stack)

    signal.signal(signal.SIGUSR1, show)
