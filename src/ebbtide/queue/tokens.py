"""``ebb server``'s bearer tokens: issued by an admin to one user, revoked, checked.

A token is 256 random bits (``secrets.token_urlsafe(32)``) behind the prefix ``ebt_``, so
a leaked one is easy to recognise (in a log, a repository, a secret scanner).  Only its
SHA-256 is stored: a plain hash is enough for a secret that random (nothing to guess, so
nothing to slow down), and a copy of the database gives no one a token.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import asdict, dataclass
from typing import Any

import sqlalchemy as sa

from ebbtide.clock import Clock
from ebbtide.errors import Unauthenticated, UserError
from ebbtide.queue.engine import reading
from ebbtide.queue.models import Token

TOKENS: sa.Table = Token.__table__  # type: ignore[attr-defined]

#: What every token starts with.
TOKEN_PREFIX = "ebt_"
#: Longest token accepted for checking, in characters (a real one is 47).
MAX_TOKEN_CHARS = 128
#: Longest note on a token, in characters.
MAX_NOTE_CHARS = 1000


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class TokenInfo:
    """A token as ``ebb token list`` shows it (never the token, nor its hash)."""

    id: int
    user: str
    note: str
    created_by: str
    #: Unix seconds
    created_at: float
    expires_at: float | None
    revoked_at: float | None
    revoked_by: str | None
    #: ``active``, ``expired`` or ``revoked``
    state: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Tokens:
    """The ``tokens`` table."""

    def __init__(self, engine: sa.Engine, clock: Clock) -> None:
        self.engine = engine
        self.clock = clock

    def create(
        self, user: str, *, by: str, note: str = "", expires_s: float | None = None
    ) -> tuple[int, str]:
        """Issue a token to ``user``; return its id and the token (shown this once)."""
        if len(note) > MAX_NOTE_CHARS or "\0" in note:
            raise UserError(f"--note: at most {MAX_NOTE_CHARS} characters, no NUL byte")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = self.clock.time()
        with self.engine.begin() as conn:
            result = conn.execute(
                TOKENS.insert().values(
                    user=user,
                    digest=digest(token),
                    note=note,
                    created_by=by,
                    created_at=now,
                    expires_at=None if expires_s is None else now + expires_s,
                )
            )
        return int(result.inserted_primary_key[0]), token  # type: ignore[index]

    def revoke(self, token_id: int, *, by: str) -> TokenInfo:
        """Refuse the token from now on (a token already revoked stays as it was)."""
        with self.engine.begin() as conn:
            conn.execute(
                TOKENS.update()
                .where(TOKENS.c.id == token_id, TOKENS.c.revoked_at.is_(None))
                .values(revoked_at=self.clock.time(), revoked_by=by)
            )
        found = [t for t in self.all() if t.id == token_id]
        if not found:
            raise UserError(f"no token with id {token_id} (see ebb token list)")
        return found[0]

    def all(self) -> list[TokenInfo]:
        """Every token ever issued, oldest first."""
        with reading(self.engine) as conn:
            rows = conn.execute(sa.select(TOKENS).order_by(TOKENS.c.id)).mappings().all()
        return [self._info(dict(r)) for r in rows]

    def _info(self, row: dict[str, Any]) -> TokenInfo:
        row.pop("digest")
        return TokenInfo(**row, state=self._state(row))

    def _state(self, row: dict[str, Any]) -> str:
        if row["revoked_at"] is not None:
            return "revoked"
        if row["expires_at"] is not None and row["expires_at"] <= self.clock.time():
            return "expired"
        return "active"

    def check(self, token: str) -> TokenInfo:
        """The token in force that ``token`` is, else :class:`Unauthenticated` saying
        why (unknown, revoked, expired) without repeating the token."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > MAX_TOKEN_CHARS:
            raise Unauthenticated(f"that is not an ebbtide token (they start with {TOKEN_PREFIX})")
        with reading(self.engine) as conn:
            row = (
                conn.execute(sa.select(TOKENS).where(TOKENS.c.digest == digest(token)))
                .mappings()
                .first()
            )
        if row is None:
            raise Unauthenticated("unknown token; ask an admin for one (ebb token create)")
        info = self._info(dict(row))
        if info.state == "revoked":
            raise Unauthenticated(f"token {info.id} was revoked; ask an admin for a new one")
        if info.state == "expired":
            raise Unauthenticated(f"token {info.id} expired; ask an admin for a new one")
        return info
