"""Invitation emails: sent through a real (local) SMTP server, or logged without SMTP_URL."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from gateway.keys import MAILER
from tests.conftest import AppFactory
from tests.upstreams import free_port


class Inbox:
    """An aiosmtpd handler keeping every message it receives."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, list[str], Message]] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        message = message_from_bytes(envelope.content)
        self.messages.append((envelope.mail_from, list(envelope.rcpt_tos), message))
        return "250 OK"  # stored before the client hears that the message was accepted


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


async def test_an_invitation_is_emailed_with_its_link(
    make_api: AppFactory, smtp: tuple[Inbox, int]
) -> None:
    inbox, port = smtp
    api = await make_api(smtp_url=f"smtp://127.0.0.1:{port}")
    owner = await api.org(await api.signup(name="Olga"), name="Acme")

    invite = await api.invite(owner, "Ada@Example.com")

    await api.app[MAILER].close()  # waits for the emails being sent in the background
    [(sender, recipients, message)] = inbox.messages
    assert recipients == ["ada@example.com"]
    assert "mcp-gateway" in sender
    assert message["To"] == "ada@example.com"
    assert "Olga" in message["Subject"] and "Acme" in message["Subject"]
    body = message.get_payload(decode=True)
    assert isinstance(body, bytes)
    assert invite["invite_url"] in body.decode()
    assert invite["invite_url"].startswith("http://gateway.test/invite/")


async def test_without_smtp_the_link_is_logged_and_mail_failures_never_fail_the_request(
    make_api: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    without_smtp = await make_api()
    owner = await without_smtp.org(await without_smtp.signup())
    with caplog.at_level(logging.INFO, logger="gateway.mailer"):
        invite = await without_smtp.invite(owner, "ada@example.com")
    assert any(invite["invite_url"] in r.getMessage() for r in caplog.records)
    caplog.clear()

    # A mail server that cannot be reached: the invitation is still created (201), and the
    # failure to send it is logged.
    unreachable = await make_api(smtp_url=f"smtp://127.0.0.1:{free_port()}")
    with caplog.at_level(logging.ERROR, logger="gateway.mailer"):
        await unreachable.invite(owner, "bob@example.com")
        await unreachable.app[MAILER].close()  # sending happens in the background
    [record] = caplog.records
    assert "bob@example.com" in record.getMessage()
