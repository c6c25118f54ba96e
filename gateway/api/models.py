"""Base models and field types shared by the API modules."""

from __future__ import annotations

import ipaddress
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import email_validator
from aiohttp import web
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    EmailStr,
    Field,
    GetJsonSchemaHandler,
    StringConstraints,
    field_validator,
)
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from gateway.db.types import BIGINT_MAX
from gateway.errors import ValidationFailed
from gateway.keys import SETTINGS
from gateway.policy.rules import MAX_PATTERN, MAX_PATTERNS, check_pattern, parse_rate_limit


@dataclass(frozen=True, slots=True)
class Documented:
    """A pattern for the OpenAPI document only, stating what a field's validators refuse in
    terms a client (or a fuzzer) can check before sending: the validators stay the rule and
    give the readable message; the pattern may be stricter, never looser."""

    pattern: str

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["pattern"] = self.pattern
        return json_schema


def any_case(word: str) -> str:
    """A regex for a word in any letter case (JSON Schema patterns take no flags)."""
    return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else re.escape(c) for c in word)


# Text with anything but NUL (PostgreSQL cannot store it); the document's default for text.
NUL_FREE = r"^[^\u0000]*$"


class DocumentSchema(GenerateJsonSchema):
    """JSON Schema for the OpenAPI document. Inputs are refused with a NUL character in any
    text, so every input text without a pattern of its own says so."""

    def str_schema(self, schema: core_schema.StringSchema) -> JsonSchemaValue:
        json_schema = super().str_schema(schema)
        if self.mode == "validation":
            json_schema.setdefault("pattern", NUL_FREE)
        return json_schema


# Text that whitespace stripping leaves as it is and non-empty.
TRIMMED = r"^[^\s\u0000](?:[^\u0000]*[^\s\u0000])?$"

# C0 and C1 control characters and DEL (CR and LF among them), as a regex class body.
_CONTROL = r"\u0000-\u001f\u007f-\u009f"
# A name: trimmed, non-empty, and on one line without control characters (a name ends up in
# emails, logs and pages, where a line break can start something of its own).
NAME_PATTERN = rf"^[^\s{_CONTROL}](?:[^{_CONTROL}]*[^\s{_CONTROL}])?$"

# The URLs _http_url takes, as far as a pattern can say (IPv6 literals and international names
# are taken too, but not described).
_PORT = r"(?:[0-9]{1,4}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
_LABEL = r"[A-Za-z0-9_~%!$&'()*+,;=-]{1,63}"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_QUAD = rf"(?:{_OCTET}\.){{3}}{_OCTET}"
URL_PATTERN = (
    rf"^{any_case('http')}[sS]?://"
    # A dotted quad (not those always refused: link-local, unspecified, Alibaba's metadata), or
    # a name that is not all digits.
    rf"(?:(?!169\.254\.|0\.|100\.100\.100\.200(?:[:/?#]|$)){_QUAD}"
    rf"|(?![0-9.]+(?:[:/?#]|$))(?:{_LABEL}\.)*{_LABEL})"
    rf"(?::{_PORT})?(?:[/?#][!-~]*)?$"
)


def _check_host(host: str) -> None:
    """A host the gateway's HTTP client can dial: aiohttp refuses the legacy numeric forms of
    IPv4 (127.1, 2130706433) and IDNA names with empty or overlong labels fail to encode."""
    if ":" in host:
        return  # an IPv6 literal, which urlsplit has checked
    if host.replace(".", "").isdigit():
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValueError("has a numeric host that is not a dotted-quad IPv4 address") from None
        return
    try:
        host.encode("idna")
    except UnicodeError:
        raise ValueError("has an invalid host name (empty or overlong label)") from None


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    try:
        parts.port  # noqa: B018 -- raises on a malformed port
    except ValueError:
        raise ValueError("has an invalid port") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL with a host")
    _check_host(parts.hostname)
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
    Documented(URL_PATTERN),
]


def refuse_literal_destination(request: web.Request, field: str, url: str | None) -> None:
    """A URL whose host is an IP address the outbound policy refuses: 422 now, rather than a
    connection refused on every use (a name is judged when it is resolved)."""
    why = None if url is None else request.app[SETTINGS].outbound.literal_refusal(url)
    if why is not None:
        raise ValidationFailed(
            f"body.{field}: the address is refused by the outbound policy ({why})"
        )


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
Timestamp = Annotated[datetime, AfterValidator(_in_utc), Documented(r"^(?!0001-|9999-)")]
QueryTimestamp = Annotated[Timestamp, BeforeValidator(_timestamp_text)]


class Out(BaseModel):
    """A response shape for the OpenAPI document (handlers return plain data).

    extra="forbid" makes the documented schema closed, so the contract tests catch a field
    that a handler returns but the document does not list.
    """

    model_config = ConfigDict(extra="forbid")


# email-validator wants a domain with a dot, ending with a letter, not special-use (.local,
# .test, ...): the document says so.
_SPECIAL_USE = "|".join(any_case(d) for d in email_validator.SPECIAL_USE_DOMAIN_NAMES)
EMAIL_PATTERN = (
    rf"^[^\u0000@]+@(?!(?:[^@]*\.)?(?:{_SPECIAL_USE})$)"
    r"[^\u0000@.]+(?:\.[^\u0000@.]+)*\.[^\u0000@.]*[A-Za-z]$"
)
Email = Annotated[
    EmailStr,
    BeforeValidator(_normalise_email),
    Documented(EMAIL_PATTERN),
]

_CONTROL_CHARACTER = re.compile(f"[{_CONTROL}]")


def _one_line(value: str) -> str:
    if _CONTROL_CHARACTER.search(value):
        raise ValueError("must not contain control characters (such as line breaks or tabs)")
    return value


Name = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=200),
    AfterValidator(_one_line),
    Documented(NAME_PATTERN),
]
Password = Annotated[str, StringConstraints(min_length=8, max_length=1024)]
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9-]{1,62}$")]
RoleName = Literal["owner", "admin", "member"]
# A probe's status (gateway.mcp.probe), and a server's: its latest probe's, `unknown` before one.
CheckStatus = Literal["healthy", "degraded", "down"]
ServerStatus = Literal[CheckStatus, "unknown"]
InviteRole = Literal["admin", "member"]


def _whole(value: object) -> object:
    # JSON has one kind of number: 5.0 is the integer 5 (as JSON Schema says), which pydantic's
    # strict mode would refuse.
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Last in the Annotated of an int in a JSON body, after its constraints (which then still
# show in the document): Annotated[int, Field(ge=0), WHOLE].
WHOLE = BeforeValidator(_whole)

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


# Governed access (gateway/policy/rules.py holds the rules these fields become).


def _pattern(value: str) -> str:
    return check_pattern(value)


def _rate_limit(value: str) -> str:
    return str(parse_rate_limit(value))  # as written back: "100/minute"


def _distinct(values: list[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


# For the document, the characters of MCP's tool names and the two wildcards (stricter than
# check_pattern, which takes any printable character but the wildcards of other dialects).
ToolPattern = Annotated[
    str,
    StringConstraints(max_length=MAX_PATTERN),
    AfterValidator(_pattern),
    Documented(r"^[A-Za-z0-9_./*?-]+$"),
]
ToolPatterns = Annotated[
    list[ToolPattern],
    Field(
        max_length=MAX_PATTERNS,
        description="tool name globs: * is any characters, ? is one character",
    ),
    AfterValidator(_distinct),
]
RateLimitText = Annotated[
    str,
    AfterValidator(_rate_limit),
    Field(
        description="N calls per unit, N at least 1: 'N/second', 'N/minute', 'N/hour' or 'N/day'"
    ),
    Documented(r"^[1-9][0-9]{0,8}/(second|minute|hour|day)$"),
]
Permission = Literal["proxy", "ingest", "read"]
Permissions = Annotated[list[Permission], AfterValidator(_distinct)]
