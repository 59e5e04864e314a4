"""The agent's Celery side: a worker that consumes only its node's queue.

Messages are nudges: each carries a whole signed snapshot, and the enforcer decides whether
to believe it. Remote control and events are off, so the worker listens to nothing but
``node.<name>``. The broker being down only delays new snapshots; it never stops enforcement.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Queue

APPLY_SNAPSHOT_TASK = "gpubook.agent.apply_snapshot"


def queue_name(node_name: str) -> str:
    """The Celery queue the portal pushes ``node_name``'s snapshots to, and its agent consumes."""
    return f"node.{node_name}"


def make_app(*, broker_url: str, queue: str, offer: Any) -> Celery:
    """A Celery app whose one task hands each snapshot to ``offer`` (Enforcer.offer)."""
    app = Celery("gpubook-agent", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_queues=[Queue(queue, routing_key=queue)],
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
        broker_transport_options={"socket_timeout": 10, "socket_connect_timeout": 5},
    )

    @app.task(name=APPLY_SNAPSHOT_TASK, ignore_result=True)
    def apply_snapshot(snapshot: Any) -> str:
        return offer(snapshot)

    return app
