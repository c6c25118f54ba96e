"""Base models and field types shared by the API modules."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    EmailStr,
    Field,
    StringConstraints,
    field_validator,
)

from gateway.errors import ValidationFailed
from gateway.keys import SETTINGS


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 -- raises on a malformed port
    except ValueError:
        raise ValueError("has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    if any(c.isspace() for c in value):
        raise ValueError("must not contain whitespace")
    if "@" in parts.netloc:
        # Credentials in a URL end up in logs and in whatever it is shown to.
        raise ValueError("must not contain a user or password (user@host): use credentials")
    return value


# An http(s) URL the gateway will connect to (an upstream, a webhook).
HttpUrl = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=2048),
    AfterValidator(_http_url),
]


def refuse_literal_destination(request: web.Request, field: str, url: str | None) -> None:
    """A URL whose host is an IP address the outbound policy refuses: 422 now, rather than a
    connection refused on every use (a name is judged when it is resolved)."""
    why = None if url is None else request.app[SETTINGS].outbound.literal_refusal(url)
    if why is not None:
        raise ValidationFailed(
            f"body.{field}: the address is refused by the outbound policy ({why})"
        )


# PostgreSQL's bigint: larger offsets cannot even be sent to it.
BIGINT_MAX = 2**63 - 1
_NUL_FREE = "must not contain NUL characters"


def _normalise_email(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def refuse_nul(value: Any) -> Any:
    """PostgreSQL text cannot hold NUL: a text with one (or a list of such texts) is refused
    by name, rather than failing in the database."""
    if isinstance(value, str):
        if "\x00" in value:
            raise ValueError(_NUL_FREE)
    elif isinstance(value, list) and any(isinstance(v, str) and "\x00" in v for v in value):
        raise ValueError(_NUL_FREE)
    return value


class _Input(BaseModel):
    """What a client sends: every text field refused with a NUL character."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        return refuse_nul(value)


class Body(_Input):
    """A JSON request body: strict types (no "1" for 1), unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class Query(_Input):
    """Query parameters arrive as strings, so these convert ("50" -> 50)."""

    model_config = ConfigDict(extra="ignore")


_NUMBER = re.compile(r"\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*")


def _timestamp_text(value: object) -> object:
    # pydantic would read a number as seconds since 1970: a query's "0.5" is a mistake.
    if isinstance(value, str) and _NUMBER.fullmatch(value):
        raise ValueError("must be an ISO 8601 timestamp, e.g. 2026-11-24T10:00:00Z")
    return value


def _in_utc(value: datetime) -> datetime:
    """In UTC (naive ones are UTC); one that UTC cannot write (year 1 at +14:00, year 9999 at
    -14:00) is refused rather than failing later."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise ValueError("is out of range (years 1 to 9999 in UTC)") from None


# A point in time from a client, always in UTC once validated: in a query ISO 8601 only (a
# strict JSON body takes no number for a datetime anyway).
Timestamp = Annotated[datetime, AfterValidator(_in_utc)]
QueryTimestamp = Annotated[Timestamp, BeforeValidator(_timestamp_text)]


class Out(BaseModel):
    """A response shape for the OpenAPI document (handlers return plain data).

    extra="forbid" makes the documented schema closed, so the contract tests catch a field
    that a handler returns but the document does not list.
    """

    model_config = ConfigDict(extra="forbid")


Email = Annotated[EmailStr, BeforeValidator(_normalise_email)]
Name = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=200)]
Password = Annotated[str, StringConstraints(min_length=8, max_length=1024)]
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{1,62}$")]
RoleName = Literal["owner", "admin", "member"]
InviteRole = Literal["admin", "member"]

Limit = Annotated[int, Field(ge=1, le=200, description="page size (max 200)")]
Offset = Annotated[int, Field(ge=0, le=BIGINT_MAX, description="rows to skip")]


class Page(Query):
    limit: Limit = 50
    offset: Offset = 0


class UserOut(Out):
    id: uuid.UUID
    email: str
    name: str


class WorkspaceOut(Out):
    id: uuid.UUID
    name: str
    slug: str
    is_personal: bool
    created_at: datetime
    role: RoleName
