"""Invitation and verification emails: sent through a real (local) SMTP server, or logged
without SMTP_URL; nothing of a tenant's choosing in a header."""

from __future__ import annotations

import logging
import uuid

import asyncpg
import pytest

from gateway.accounts.mailer import INVITE_SUBJECT, MAILER, VERIFY_SUBJECT
from tests.helpers.api import AppFactory
from tests.helpers.mail import Inbox
from tests.helpers.upstreams import free_port


async def test_an_invitation_is_emailed_with_its_link_under_a_fixed_subject(
    make_api: AppFactory, smtp: Inbox
) -> None:
    api = await make_api(smtp_url=smtp.url)
    owner = await api.org(await api.signup(name="Olga"), name="Acme")

    invite = await api.invite(owner, "Ada@Example.com")

    [mail] = await smtp.received(api, "ada@example.com")
    assert "mcp-gateway" in mail.sender
    assert mail.message["To"] == "ada@example.com"
    # The subject is the gateway's own words: a workspace's or inviter's name (which anyone
    # signing up chooses) is not the first thing a stranger reads.
    assert mail.message["Subject"] == INVITE_SUBJECT
    assert "Olga" in mail.body and "Acme" in mail.body
    assert invite["invite_url"] in mail.body
    assert invite["invite_url"].startswith("http://gateway.test/invite/")


async def test_a_stored_name_with_line_breaks_never_fails_an_invitation_nor_reaches_a_header(
    make_api: AppFactory, smtp: Inbox, db: asyncpg.Connection
) -> None:
    """Names stored before the API refused control characters: the invitation is still
    created and sent (it used to be saved, then answer 500), and the names stay in the body,
    on one line."""
    api = await make_api(smtp_url=smtp.url)
    owner = await api.org(await api.signup(name="Olga"), name="Acme")
    await db.execute(
        "UPDATE workspaces SET name = $2 WHERE id = $1",
        uuid.UUID(owner.workspace_id),
        "Acme\r\nBcc: victim@example.com\r\nSubject: cheap pills",
    )
    await db.execute(
        "UPDATE users SET name = $2 WHERE id = $1",
        uuid.UUID(owner.user_id),
        "Olga\nX-Injected: yes\x85\x07",
    )

    invite = await api.invite(owner, "ada@example.com")

    [mail] = await smtp.received(api, "ada@example.com")
    assert not [m for m in smtp.mails if "victim@example.com" in m.recipients]
    assert mail.message["Bcc"] is None and mail.message["X-Injected"] is None
    assert mail.message["Subject"] == INVITE_SUBJECT
    assert "Acme Bcc: victim@example.com Subject: cheap pills" in mail.body
    assert "Olga X-Injected: yes invited you" in mail.body
    assert invite["invite_url"] in mail.body


async def test_a_verification_email_carries_only_the_link(
    make_api: AppFactory, smtp: Inbox
) -> None:
    api = await make_api(smtp_url=smtp.url)
    await api.signup("ada@example.com", name="Ada <b>Buy now</b>")
    [mail] = await smtp.received(api, "ada@example.com")
    assert mail.message["Subject"] == VERIFY_SUBJECT
    assert "Buy now" not in mail.body  # nothing of the account holder's choosing
    token = mail.link("http://gateway.test/verify-email")
    assert token.count(".") == 2  # a signed token (JWT)
    assert "expires in 24 hours" in mail.body


async def test_without_smtp_the_link_is_logged_and_mail_failures_never_fail_the_request(
    make_api: AppFactory, caplog: pytest.LogCaptureFixture
) -> None:
    without_smtp = await make_api()
    owner = await without_smtp.org(await without_smtp.signup())
    with caplog.at_level(logging.INFO, logger="gateway.accounts.mailer"):
        invite = await without_smtp.invite(owner, "ada@example.com")
    assert any(invite["invite_url"] in r.getMessage() for r in caplog.records)
    caplog.clear()

    # A mail server that cannot be reached: the invitation is still created (201), and the
    # failure to send it is logged.
    unreachable = await make_api(smtp_url=f"smtp://127.0.0.1:{free_port()}")
    with caplog.at_level(logging.ERROR, logger="gateway.accounts.mailer"):
        await unreachable.invite(owner, "bob@example.com")
        await unreachable.app[MAILER].close()  # sending happens in the background
    # (The mailer's own: start-up may log others, such as OAuth being off.)
    [record] = [r for r in caplog.records if r.name == "gateway.accounts.mailer"]
    assert "bob@example.com" in record.getMessage()
