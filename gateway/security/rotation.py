"""Re-encrypting every stored upstream credential with the first key (mcp-gateway rotate-secrets).

Rotation: run every gateway with GATEWAY_SECRET_KEYS="NEW,OLD", run this, then drop OLD.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass, field

import asyncpg
from cryptography.fernet import InvalidToken

from gateway.db import servers as servers_db
from gateway.security.secretbox import SecretBox

log = logging.getLogger(__name__)

_PAGE = 500


@dataclass(frozen=True, slots=True)
class RotationReport:
    rotated: int
    # Changed by a PATCH while this ran; a gateway sealed them with its own first key.
    skipped: int
    # No configured key decrypts them: they were sealed with a key that is no longer listed.
    undecryptable: list[uuid.UUID] = field(default_factory=list)


async def rotate_credentials(pool: asyncpg.Pool, box: SecretBox) -> RotationReport:
    rotated = skipped = 0
    undecryptable: list[uuid.UUID] = []
    after = uuid.UUID(int=0)
    while page := await servers_db.sealed_credentials_page(pool, after, _PAGE):
        after = page[-1].id
        replacements = []
        for sealed in page:
            try:
                replacements.append((sealed, box.rotate(sealed.credentials)))
            except InvalidToken:
                log.error("credentials of server %s cannot be decrypted with any key", sealed.id)
                undecryptable.append(sealed.id)
        stored = await servers_db.reseal(pool, replacements)
        rotated += stored
        skipped += len(replacements) - stored
    return RotationReport(rotated, skipped, undecryptable)
