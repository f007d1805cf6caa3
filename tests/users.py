"""Real Unix users for the tests that prove isolation between users.

They are created (once, idempotently) with ``useradd`` when the tests run as root, as
they do in CI.  Elsewhere such tests skip with the reason; with ``CI=true`` they fail.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass

import pytest

#: the test users: two ordinary users and one the policy makes an admin
ALICE = "ebbtest-alice"
BOB = "ebbtest-bob"
CAROL = "ebbtest-carol"


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: str

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` as this user's login would have it (HOME, USER, LOGNAME)."""
        return {**base, "HOME": self.home, "USER": self.name, "LOGNAME": self.name}


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must prove isolation between real users, but {reason}")
    pytest.skip(reason)


def real_user(name: str) -> User:
    """The Unix user ``name``, created if missing (needs root and ``useradd``)."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        if os.geteuid() != 0:
            _unavailable(f"creating the test user {name} needs root")
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        if not os.path.exists(useradd):
            _unavailable("useradd is not installed")
        proc = subprocess.run(
            [useradd, "--create-home", "--user-group", "--shell", "/bin/sh", name],
            capture_output=True,
            text=True,
        )
        if proc.returncode not in (0, 9):  # 9: it appeared meanwhile
            _unavailable(f"useradd {name} failed: {proc.stderr.strip()}")
        entry = pwd.getpwnam(name)
    return User(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir)


def require_root() -> None:
    if os.geteuid() != 0:
        _unavailable("running jobs as other users needs root")
