"""Settings read from the environment.  Every command and the SDK honour them.

- ``EBBTIDE_HOME``: state directory (SQLite database, logs, checkpoints); ``~/.ebbtide``
- ``EBBTIDE_DB_URL``: SQLAlchemy URL of the store (``postgresql://…``); SQLite in the home
- ``EBBTIDE_REDIS_URL``: Redis URL of the broker in distributed mode; none (in-memory)
- ``EBBTIDE_NAMESPACE``: prefix of broker keys and queues, to share one Redis; ``ebbtide``
- ``EBBTIDE_POLICY``: the policy file; none (built-in defaults)
- ``EBBTIDE_USER``: for an admin only, the user to act for (submit as, cancel as);
  everyone else is who the OS says they are (see :mod:`ebbtide.identity`)
- ``EBBTIDE_URL``: the ``ebb server`` to talk to instead of the store
  (``https://host:8786``, ``unix:///run/ebbtide/api.sock``); none (direct store access)
- ``EBBTIDE_TOKEN``: the bearer token for ``EBBTIDE_URL``; else the file
  ``~/.config/ebbtide/token`` (mode 0600)
- ``EBBTIDE_RUN_AS``: ``ebb worker`` / ``ebb up --run-as``: whom attempts run as, their
  ``owner`` (``ebb worker``'s default) or the ``agent``'s own user (``ebb up``'s)
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel


class Settings(BaseModel):
    home: Path
    db_url: str
    redis_url: str | None = None
    namespace: str = "ebbtide"
    policy_path: Path | None = None
    #: EBBTIDE_USER: whom an admin acts for (refused for anyone else)
    act_as: str | None = None
    #: EBBTIDE_URL / EBBTIDE_TOKEN: the API server, when the store is not ours to open
    url: str | None = None
    token: str | None = None

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        home = Path(env.get("EBBTIDE_HOME") or Path.home() / ".ebbtide").expanduser()
        db_url = env.get("EBBTIDE_DB_URL") or f"sqlite:///{home / 'ebbtide.db'}"
        uses_store = not env.get("EBBTIDE_URL")  # a client of ebb server opens none
        file = sqlite_file(db_url) if uses_store and env.get("EBBTIDE_DB_URL") else None
        if file is not None:
            # a mistyped directory is named, not made (a new EBBTIDE_HOME is made)
            where = file.parent
            if where != Path() and not where.is_dir():
                from ebbtide.errors import ConfigError

                raise ConfigError(
                    f"EBBTIDE_DB_URL: {redacted(db_url)}: the directory {where} does not exist"
                )
        return cls(
            home=home,
            db_url=normalise_db_url(db_url),
            redis_url=env.get("EBBTIDE_REDIS_URL") or None,
            namespace=env.get("EBBTIDE_NAMESPACE") or "ebbtide",
            policy_path=Path(env["EBBTIDE_POLICY"]) if env.get("EBBTIDE_POLICY") else None,
            act_as=env.get("EBBTIDE_USER") or None,
            url=env.get("EBBTIDE_URL") or None,
            token=env.get("EBBTIDE_TOKEN") or None,
        )


def sqlite_file(url: str) -> Path | None:
    """The file a ``sqlite:///PATH`` store URL names; None for another kind of store, or
    for SQLite in memory."""
    if not url.startswith("sqlite:///"):
        return None
    path = url.removeprefix("sqlite:///")
    return Path(path) if path and path != ":memory:" else None


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
        "EBBTIDE_URL",
        "EBBTIDE_TOKEN",
        "EBBTIDE_RUN_AS",
        "EBBTIDE_HOME",
        "PGPASSWORD",
        "PGPASSFILE",
        "REDISCLI_AUTH",
    }
)


def redacted(url: str) -> str:
    """``url`` with its password (if any: ``user:password@``, or a ``password=`` query
    parameter, which the Redis and PostgreSQL clients accept too) replaced by ``***``,
    for messages and logs."""
    from ebbtide.redaction import scrub

    return scrub(url)
