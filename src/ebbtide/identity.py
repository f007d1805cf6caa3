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

from ebbtide.errors import PermissionDenied, UserError
from ebbtide.units import shown


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


#: Longest user name accepted where one is typed in (a token's user, an act-for header),
#: in characters.
MAX_USER_CHARS = 256


def check_user_name(name: str, what: str) -> str:
    """``name`` if it can be a user's name (printable, no whitespace, at most
    :data:`MAX_USER_CHARS`), else a :class:`UserError` naming ``what`` gave it."""
    if not name or len(name) > MAX_USER_CHARS or not name.isprintable() or " " in name:
        raise UserError(
            f"{what}: {shown(name)} is not a user name (1-{MAX_USER_CHARS} printable "
            "characters, no spaces)"
        )
    return name


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
    caller = Caller(
        real, admin=is_admin(real, admins, uid=uid), via=f"uid {uid} on {socket.gethostname()}"
    )
    return acting_for(caller, act_as, f"EBBTIDE_USER={act_as}", "unset EBBTIDE_USER")


def acting_for(caller: Caller, act_as: str | None, given: str, undo: str) -> Caller:
    """``caller`` acting for ``act_as``: allowed to admins only, and recorded as theirs
    (``by``).  ``given`` says where ``act_as`` came from and ``undo`` how to drop it, for
    the refusal."""
    if not act_as or act_as == caller.user:
        return caller
    if not caller.admin:
        raise PermissionDenied(
            f"{given}: only admins may act for another user, and {caller.user} is not one "
            f"(admins are the policy's `admins`); {undo}"
        )
    return Caller(user=act_as, admin=True, by=caller.user, via=caller.via)
