"""Who is acting: the caller behind an SDK call, a CLI command or an API request.

Identity is never typed in:

- with direct store access (one host), the caller is the OS user running the process
  (its effective uid);
- through ``ebb server``, it is the user a bearer token was issued to, or the kernel's
  peer credentials of a Unix-socket caller (``SO_PEERCRED``).

Admins are the policy's ``admins``, and root (who owns the store on one host anyway).
``EBBTIDE_USER`` lets an admin act *for* another user; the act is recorded as the admin's
(``by``), for that user.  Anyone else setting it is refused.
"""

from __future__ import annotations

import os
import pwd
import socket
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from ebbtide.errors import PermissionDenied


@dataclass(frozen=True)
class Caller:
    """An authenticated caller.

    ``user`` is whose name the action is taken in (the owner of what it submits);
    ``by`` the admin who acts for ``user``, when one does; ``via`` how the caller was
    identified and from where (``"uid 1000 on gpu-7"``, ``"token 3 from 10.0.0.5"``).
    """

    user: str
    admin: bool = False
    by: str | None = None
    via: str = ""

    @property
    def actor(self) -> str:
        """The person who really acts: the admin acting for someone, else the user."""
        return self.by or self.user

    def attribution(self) -> dict[str, Any]:
        """What a job's events record about who did something and from where."""
        out: dict[str, Any] = {"by": self.actor}
        if self.by:
            out["for"] = self.user
        if self.via:
            out["via"] = self.via
        return out

    def describe(self) -> str:
        return f"{self.user} (by {self.by})" if self.by else self.user

    def may_act_on(self, owner: str) -> bool:
        """Owners act on their own jobs; admins on all."""
        return self.admin or owner == self.user


def user_name(uid: int) -> str:
    """The login name of ``uid`` (``uid1234`` where the password database has none)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid{uid}"


def is_admin(user: str, admins: Collection[str], *, uid: int | None = None) -> bool:
    """An admin is listed in the policy's ``admins``, or is root."""
    return uid == 0 or user in admins or user == "root"


def local_caller(admins: Collection[str], act_as: str | None = None) -> Caller:
    """The caller of this process: its OS user.  ``act_as`` (``EBBTIDE_USER``) is
    honoured only for an admin, and recorded as acting for that user."""
    uid = os.geteuid()
    real = user_name(uid)
    admin = is_admin(real, admins, uid=uid)
    via = f"uid {uid} on {socket.gethostname()}"
    if act_as and act_as != real:
        if not admin:
            raise PermissionDenied(
                f"EBBTIDE_USER={act_as}: only admins may act for another user, and "
                f"{real} is not one (admins are the policy's `admins`); unset EBBTIDE_USER"
            )
        return Caller(user=act_as, admin=True, by=real, via=via)
    return Caller(user=real, admin=admin, via=via)
