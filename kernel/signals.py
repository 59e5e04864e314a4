"""Signals in two phases: what must commit with a change, and what follows once it has.

A lower app announces what happened (``reservation_changed``, ``node_reported``, ...) and the apps
above it react; that keeps imports pointing down (docs/architecture.md). Every such announcement has
two kinds of receivers, and a receiver picks its phase by the signal it connects to:

- ``signal.in_transaction``: called at once, inside the change's transaction. For writes that must
  commit or roll back with the change (an audit row, a mail in the outbox, a waitlist offer). An
  exception here is the change's exception: the transaction rolls back.
- ``signal.on_commit``: called once the transaction has committed (at once when there is none). For
  what the outside world sees (websocket broadcasts, lease pushes, nudging a worker). A rolled-back
  change calls none of them; one that fails is logged and the others still run, since the change
  itself has already happened.

    node_reported = PhasedSignal("node_reported")

    @receiver(node_reported.on_commit)
    def broadcast_cards(sender, node, **kwargs): ...

    node_reported.send(sender=Node, node=node, now=now)

Every signal of the portal, with its phases and receivers, is listed in docs/architecture.md.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction
from django.dispatch import Signal

logger = logging.getLogger(__name__)


class PhasedSignal:
    """One announcement with an in-transaction phase and an on-commit phase."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.in_transaction = Signal()
        self.on_commit = Signal()

    def send(self, sender: Any, **kwargs: Any) -> None:
        self.in_transaction.send(sender=sender, **kwargs)
        if self.on_commit.has_listeners(sender):
            transaction.on_commit(lambda: self._after_commit(sender, kwargs))

    def _after_commit(self, sender: Any, kwargs: dict[str, Any]) -> None:
        for receiver, result in self.on_commit.send_robust(sender=sender, **kwargs):
            if isinstance(result, Exception):
                logger.error(
                    "%s: the on-commit receiver %s failed",
                    self.name,
                    getattr(receiver, "__qualname__", receiver),
                    exc_info=result,
                )

    def __repr__(self) -> str:
        return f"<PhasedSignal {self.name}>"
