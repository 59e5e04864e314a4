"""A real SMTP server for the tests (aiosmtpd, on a free port) that keeps what it receives."""

from __future__ import annotations

import asyncio
import email
import email.policy
import threading
from datetime import UTC, datetime
from email.message import EmailMessage

from aiosmtpd.controller import Controller

from tests.agent.harness import free_port, wait_for


class _Keeper:
    def __init__(self) -> None:
        self.messages: list[EmailMessage] = []
        self.lock = threading.Lock()
        self.holding = False
        self.held = 0

    async def handle_RCPT(self, server, session, envelope, address, rcpt_options):  # aiosmtpd calls it by this name
        if self.holding:  # a sender stopped mid-mail, before the server has taken anything
            with self.lock:
                self.held += 1
            while self.holding:
                await asyncio.sleep(0.02)
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd calls it by this name
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        message["X-Envelope-To"] = ", ".join(envelope.rcpt_tos)
        message["X-Received-At"] = datetime.now(UTC).isoformat()  # when this server took it: received_at()
        with self.lock:
            self.messages.append(message)
        return "250 Message accepted for delivery"


class MailServer:
    """``messages``: every mail received, parsed; ``wait_for(n)``: until n have arrived."""

    def __init__(self) -> None:
        self.keeper = _Keeper()
        self.port = free_port()
        self.controller: Controller | None = None

    def start(self) -> None:
        """Listen (again: a stopped server can start anew, on the same port)."""
        self.controller = Controller(self.keeper, hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def stop(self) -> None:
        if self.controller is not None:
            self.controller.stop()
            self.controller = None

    @property
    def messages(self) -> list[EmailMessage]:
        with self.keeper.lock:
            return list(self.keeper.messages)

    def wait_for(self, count: int, timeout: float = 10.0) -> list[EmailMessage]:
        wait_for(lambda: len(self.messages) >= count, timeout=timeout, interval=0.02)
        return self.messages

    def hold(self) -> None:
        """From now on, keep every sender waiting after it names a recipient (before it sends the mail),
        until ``release()``; ``held`` counts them."""
        self.keeper.holding = True

    def release(self) -> None:
        self.keeper.holding = False

    @property
    def held(self) -> int:
        with self.keeper.lock:
            return self.keeper.held

    def clear(self) -> None:
        with self.keeper.lock:
            self.keeper.messages.clear()


def subject_of(message: EmailMessage) -> str:
    """The subject as a reader sees it (an encoded, folded header parses with a leading space)."""
    return str(message["Subject"]).strip()


def received_at(message: EmailMessage) -> datetime:
    """When the server took the mail (its end of DATA), on this machine's clock, as the portal's own times are."""
    return datetime.fromisoformat(str(message["X-Received-At"]))


def text_of(message: EmailMessage) -> str:
    return message.get_body(preferencelist=("plain",)).get_content()


def html_of(message: EmailMessage) -> str:
    return message.get_body(preferencelist=("html",)).get_content()
