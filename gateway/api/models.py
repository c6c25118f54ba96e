"""Base models and field types shared by the API modules."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, EmailStr, Field, StringConstraints


def _normalise_email(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


class Body(BaseModel):
    """A JSON request body: strict types (no "1" for 1), unknown fields ignored."""

    model_config = ConfigDict(strict=True, extra="ignore")


class Query(BaseModel):
    """Query parameters arrive as strings, so these convert ("50" -> 50)."""

    model_config = ConfigDict(extra="ignore")


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
Offset = Annotated[int, Field(ge=0, description="rows to skip")]


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
