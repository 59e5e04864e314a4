"""The agent's Celery side: a worker that consumes only its node's queue.

Messages are nudges: each carries a whole signed snapshot, as one JSON string (so that the
agent, not kombu, parses it, within its own size and nesting limits), and the enforcer decides
whether to believe it. Whatever the worker cannot hand to the enforcer (a body kombu cannot
decode, content it does not accept, another task's name) is reported as a refused snapshot too,
not only logged as Celery would. Remote control and events are off, so the worker listens to
nothing but ``node.<name>``. The broker being down only delays new snapshots; it never stops
enforcement.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.worker import state
from celery.worker.consumer import Consumer
from kombu import Queue

from gpubook_agent.protocol import APPLY_SNAPSHOT_TASK
from gpubook_agent.stopping import STOP_SIGNALS, threads_shown_on_sigusr1

# How the agent's consumer uses a Redis broker, chosen so that its broker user needs only PING and BRPOP on
# the one key node.<name> (nodes/broker_users.py; docs/agent.md, "The broker"). Without ack emulation kombu
# keeps no copy of a message in the unacked, unacked_index and unacked_mutex keys that every consumer
# shares (a node allowed those could read or delete everyone's messages in flight); a snapshot lost with a
# crashing agent is sent again by beat within a minute. One priority step: the consumer reads the queue's
# own key only, not its priority sub-keys (the portal sends no priority). Other brokers ignore both.
AGENT_TRANSPORT_OPTIONS: dict[str, Any] = {
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
    "ack_emulation": False,
    "priority_steps": [0],
}


def make_app(
    *, broker_url: str, queue: str, offer: Callable[[Any], str], refuse: Callable[[str], None] | None = None
) -> Celery:
    """A Celery app whose one task hands each snapshot to ``offer`` (Enforcer.offer); what never gets
    that far is reported through ``refuse`` (Enforcer.refuse)."""
    refuse = refuse or (lambda message: None)
    app = Celery("gpubook-agent", broker=broker_url, set_as_current=False)
    app.conf.update(
        # no_declare: the agent's broker user may touch its queue's one key and nothing else, so it declares
        # nothing (on Redis a declaration writes the shared _kombu.binding.* sets); the portal's push does.
        task_queues=[Queue(queue, routing_key=queue, no_declare=True)],
        task_default_queue=queue,
        accept_content=["json"],
        task_serializer="json",
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_enable_remote_control=False,
        worker_send_task_events=False,
        worker_hijack_root_logger=False,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,  # keep trying for ever; enforcement goes on meanwhile
        broker_transport_options=AGENT_TRANSPORT_OPTIONS,
    )
    app.conf.worker_consumer = reporting_consumer(refuse)

    @app.task(name=APPLY_SNAPSHOT_TASK, ignore_result=True)
    def apply_snapshot(*args: Any, **kwargs: Any) -> str:
        # One argument: the snapshot's JSON text (or, from an older portal, the object: for one release).
        # Any other shape is a refusal here, not a TypeError that Celery would only log.
        if len(args) != 1 or kwargs:
            refuse(f"a push carries one snapshot argument, this one {len(args)} and {len(kwargs)} keyword(s)")
            return "refused"
        return offer(args[0])

    return app


def make_worker(app: Celery, *, node_name: str, loglevel: str) -> Any:
    """The worker that consumes the node's queue in the main thread: one task at a time, no remote control, and
    every stop signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) a warm stop, after which main.py takes every grant back.
    Celery's own handlers would re-execute the process on SIGHUP and end it at once on a second Ctrl-C or on
    SIGQUIT, skipping that (stopping.py). SIGUSR1 keeps Celery's meaning (the threads' stacks); a signal nobody
    handles that ends a process (SIGUSR2, SIGALRM) is a kill like SIGKILL, which ExecStopPost= covers."""

    def install_platform_tweaks(self: Any, worker: Any) -> None:
        def warm_stop(signum: int, _frame: Any) -> None:
            logging.getLogger(__name__).info("%s received: stopping", signal.Signals(signum).name)
            # EX_OK, as Celery's own handler sets it: the worker's loop sees it and returns from start().
            setattr(state, "should_stop", 0)  # noqa: B010 - the module's stub types it None

        for sig in STOP_SIGNALS:
            signal.signal(sig, warm_stop)
        threads_shown_on_sigusr1()

    worker_class = type("AgentWorker", (app.Worker,), {"install_platform_tweaks": install_platform_tweaks})
    return worker_class(
        pool="solo",
        concurrency=1,
        hostname=f"agent@{node_name}",
        loglevel=loglevel,
        without_heartbeat=True,
        without_mingle=True,
        without_gossip=True,
        quiet=True,
    )


def reporting_consumer(refuse: Callable[[str], None]) -> type[Consumer]:
    """Celery's consumer, which also reports what it can only log: a message it cannot decode (not JSON,
    nested too deep for kombu's parser, a bad encoding), content it does not accept (pickle), a body of
    the wrong shape, another task's name. Each is dropped as before (acked or rejected); the enforced
    state never changes."""

    def report(what: str, error: BaseException | None) -> None:
        detail = f": {type(error).__name__}: {str(error)[:200]}" if error is not None else ""
        try:
            refuse(f"{what} on the queue{detail}")
        except Exception:  # reporting must not stop the consumer
            logging.getLogger(__name__).exception("cannot report a refused message")

    class ReportingConsumer(Consumer):
        def on_decode_error(self, message: Any, exc: Exception) -> None:
            report("a message that cannot be decoded", exc)
            super().on_decode_error(message, exc)

        def on_unknown_message(self, body: Any, message: Any) -> None:
            report("a message that is not a task", None)
            super().on_unknown_message(body, message)

        def on_unknown_task(self, body: Any, message: Any, exc: Exception) -> None:
            report("a message for another task", exc)
            super().on_unknown_task(body, message, exc)

        def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
            report("an invalid message", exc)
            super().on_invalid_task(body, message, exc)

    return ReportingConsumer
