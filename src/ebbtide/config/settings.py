"""Settings read from the environment.  Every command and the SDK honour them.

- ``EBBTIDE_HOME``: state directory (SQLite database, logs, checkpoints); ``~/.ebbtide``
- ``EBBTIDE_DB_URL``: SQLAlchemy URL of the store (``postgresql://…``); SQLite in the home
- ``EBBTIDE_REDIS_URL``: Redis URL of the broker in distributed mode; none (in-memory)
- ``EBBTIDE_NAMESPACE``: prefix of broker keys and queues, to share one Redis; ``ebbtide``
- ``EBBTIDE_POLICY``: the policy file; none (built-in defaults)
- ``EBBTIDE_USER``: the owner recorded on submitted jobs; the login name
- ``EBBTIDE_ADMINS``: comma-separated users who may act on anyone's jobs; ``root``
"""

from __future__ import annotations

import getpass
import os
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel


class Settings(BaseModel):
    home: Path
    db_url: str
    redis_url: str | None = None
    namespace: str = "ebbtide"
    policy_path: Path | None = None
    user: str
    admins: frozenset[str] = frozenset({"root"})

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        home = Path(env.get("EBBTIDE_HOME") or Path.home() / ".ebbtide").expanduser()
        db_url = env.get("EBBTIDE_DB_URL") or f"sqlite:///{home / 'ebbtide.db'}"
        admins = env.get("EBBTIDE_ADMINS")
        return cls(
            home=home,
            db_url=normalise_db_url(db_url),
            redis_url=env.get("EBBTIDE_REDIS_URL") or None,
            namespace=env.get("EBBTIDE_NAMESPACE") or "ebbtide",
            policy_path=Path(env["EBBTIDE_POLICY"]) if env.get("EBBTIDE_POLICY") else None,
            user=env.get("EBBTIDE_USER") or _login_name(),
            admins=frozenset(a.strip() for a in admins.split(",") if a.strip())
            if admins is not None
            else frozenset({"root"}),
        )

    def is_admin(self, user: str | None = None) -> bool:
        return (user or self.user) in self.admins


def normalise_db_url(url: str) -> str:
    """Accept ``postgresql://`` and ``postgres://`` and use the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


#: The agent's own variables that never reach a job: its credentials (the store's and the
#: broker's URLs carry passwords) and its identity.  ebbtide's job contract
#: (``EBBTIDE_JOB_ID``, ``EBBTIDE_CHECKPOINT_DIR``, …) is set for each attempt on top.
PRIVATE_VARIABLES = frozenset(
    {
        "EBBTIDE_DB_URL",
        "EBBTIDE_REDIS_URL",
        "EBBTIDE_NAMESPACE",
        "EBBTIDE_POLICY",
        "EBBTIDE_USER",
        "EBBTIDE_ADMINS",
        "EBBTIDE_HOME",
        "PGPASSWORD",
        "PGPASSFILE",
        "REDISCLI_AUTH",
    }
)


def redacted(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return f"uid{os.getuid()}"
