"""A real SMTP server on loopback (aiosmtpd) that keeps what the gateway sends, for the tests of
invitation and verification emails."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from email import message_from_bytes
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from gateway.accounts.mailer import MAILER
from tests.helpers.api import Api
from tests.helpers.upstreams import free_port


@dataclass
class Mail:
    sender: str
    recipients: list[str]
    message: Message

    @property
    def body(self) -> str:
        payload = self.message.get_payload(decode=True)
        assert isinstance(payload, bytes)
        return payload.decode()

    def link(self, path: str) -> str:
        """The token of the link `{PUBLIC_URL}{path}/{token}` in the body."""
        found = re.search(rf"{re.escape(path)}/(\S+)", self.body)
        assert found is not None, f"no {path} link in:\n{self.body}"
        return found.group(1)


class Inbox:
    """An aiosmtpd handler keeping every message it receives."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.mails: list[Mail] = []

    @property
    def url(self) -> str:
        return f"smtp://127.0.0.1:{self.port}"

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        message = message_from_bytes(envelope.content)
        self.mails.append(Mail(envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 OK"  # stored before the client hears that the message was accepted

    async def received(self, api: Api, to: str | None = None) -> list[Mail]:
        """Every mail so far (to `to` only, when given), once the gateway's background
        sending is done."""
        await api.app[MAILER].close()
        return [m for m in self.mails if to is None or m.recipients == [to]]


# The tests' `smtp` fixture (a plugin of the root conftest): an inbox on a free loopback port.
@pytest.fixture(name="smtp")
def smtp_server() -> Iterator[Inbox]:
    port = free_port()
    inbox = Inbox(port)
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox
    finally:
        controller.stop()
