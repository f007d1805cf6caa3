"""``ebb token create | list | revoke``: the bearer tokens ``ebb server`` takes (admins).

These open the store themselves (``EBBTIDE_DB_URL``), even where ``EBBTIDE_URL`` names a
server: a token is what a user needs before they can call one.  Where ``EBBTIDE_URL`` is
set they make no store: one that is not there is an error saying where tokens live.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

import click

from ebbtide.cli.common import _echo_json
from ebbtide.errors import PermissionDenied, UserError

if TYPE_CHECKING:
    from ebbtide.client import Client


def _admin_client() -> Client:
    """A client on the store itself, for an admin: one of the admins of the policy the
    scheduler published to the store, as every other command reads them (else, while
    none is published, of ``EBBTIDE_POLICY`` or the built-in policy).  Anyone else is
    refused, before a store is made where there is none."""
    from ebbtide.client import Client
    from ebbtide.client_checks import new_store_file
    from ebbtide.config.policy import load_policy
    from ebbtide.config.settings import Settings, redacted
    from ebbtide.errors import NoStore
    from ebbtide.identity import local_caller

    from_env = Settings.from_env()
    settings = from_env.model_copy(update={"url": None})
    # a trial's trap: with EBBTIDE_URL set, the token went into another store than the
    # server's, made empty for it, and the command said only a note
    where = (
        f"tokens live in the store itself, {redacted(settings.db_url)} (EBBTIDE_DB_URL, else "
        f"EBBTIDE_HOME), not behind EBBTIDE_URL={from_env.url}"
    )
    missing = new_store_file(settings)
    if missing is not None:
        # no store yet, so no policy published to it: the file's admins, before one is made
        policy = load_policy(settings.policy_path)
        caller = local_caller(policy.admins, settings.act_as)
        _refuse_unless_admin(caller, settings.policy_path or "the built-in policy")
        if from_env.url:
            raise UserError(
                f"there is no ebbtide store at {missing}: {where}; run this where the "
                "server's store is"
            )
        return Client(settings, policy=policy, caller=caller, create=True)
    try:
        client = Client(settings, create=not from_env.url)
    except NoStore:  # (a store that went between the look and the opening)
        raise UserError(f"there is no ebbtide store: {where}") from None
    # a trial's trap: admins were read from EBBTIDE_POLICY alone, so the scheduler's
    # published policy's admin got a token with no word that it is an admin's
    published = client.store.published_policy()
    try:
        _refuse_unless_admin(
            client.caller,
            f"the policy the scheduler published ({published[1] or 'built-in defaults'})"
            if published
            else settings.policy_path or "the built-in policy",
        )
    except PermissionDenied:
        client.close()
        raise
    if from_env.url:
        click.echo(f"ebb token: note: {where}; run this where the server's store is", err=True)
    return client


def _refuse_unless_admin(caller: Any, policy: object) -> None:
    if not caller.admin:
        raise PermissionDenied(
            f"only admins may manage tokens, with the store's own access "
            f"(EBBTIDE_DB_URL, or the SQLite file); {caller.user} is not an admin under "
            f"{policy}"
        )


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M")


@click.group("token")
def token_group() -> None:
    """Issue and revoke the bearer tokens of `ebb server` (admins only).

    \b
      ebb token create alice --note laptop --expires 90d   prints the token, once
      ebb token list                                       who holds which, and their state
      ebb token revoke 3                                   refused from now on

    A user keeps theirs in EBBTIDE_TOKEN or ~/.config/ebbtide/token (chmod 600).
    """


@token_group.command("create")
@click.argument("user")
@click.option("--note", default="", help="What the token is for (shown by ebb token list).")
@click.option("--expires", metavar="DURATION", help="Refused after this long: 90d, 12h, 30m.")
@click.option("--json", "as_json", is_flag=True, help='Print {"id": ..., "token": ...}.')
def create(user: str, note: str, expires: str | None, as_json: bool) -> None:
    """Issue a token to USER: requests with it act in USER's name.  It is shown once;
    only its hash is kept."""
    from ebbtide.identity import check_user_name
    from ebbtide.units import parse_duration_s

    check_user_name(user, "USER")
    expires_s = None
    if expires is not None:
        try:
            expires_s = parse_duration_s(expires)
        except ValueError as exc:
            raise UserError(f"--expires: {exc}") from None
        if expires_s <= 0:
            raise UserError("--expires: must be longer than 0s")
    with _admin_client() as client:
        token_id, token = client.create_token(user, note=note, expires_s=expires_s)
        from ebbtide.identity import is_admin

        admin = is_admin(user, client.policy.admins)
    if admin:  # a trial's trap: an admin's token, handed out without a word
        click.echo(
            f"ebb token: note: {user} is an admin here: with this token a request may act "
            "for any user, cancel anyone's jobs and drain nodes; keep it as you keep root's",
            err=True,
        )
    if as_json:
        _echo_json({"id": token_id, "user": user, "token": token})
        return
    click.echo(token)
    click.echo(
        f"token {token_id} for {user}: shown this once. The user sets EBBTIDE_TOKEN to it, "
        "or writes it to ~/.config/ebbtide/token (chmod 600).",
        err=True,
    )


@token_group.command("list")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def list_tokens(as_json: bool) -> None:
    """Every token issued: whose, by whom, when, and whether it is active, expired or
    revoked (never the token itself)."""
    with _admin_client() as client:
        tokens = client.tokens()
    if as_json:
        _echo_json([t.to_dict() for t in tokens])
        return
    click.echo(
        f"{'ID':>4} {'USER':<16} {'STATE':<8} {'CREATED':<16} {'BY':<12} {'EXPIRES':<16} NOTE"
    )
    for t in tokens:
        click.echo(
            f"{t.id:>4} {t.user[:16]:<16} {t.state:<8} {_when(t.created_at):<16} "
            f"{t.created_by[:12]:<12} {_when(t.expires_at):<16} {t.note}"
        )


@token_group.command("revoke")
@click.argument("token_id", metavar="ID")
def revoke(token_id: str) -> None:
    """Refuse the token ID from now on (see ebb token list)."""
    if not token_id.isdigit() or len(token_id) > 18:
        raise UserError(f"ID: expected a token's number (see ebb token list), got {token_id!r}")
    number = int(token_id)
    with _admin_client() as client:
        before = next((t for t in client.tokens() if t.id == number), None)
        info = client.revoke_token(number)
    if before is not None and before.state == "revoked":  # a trial's trap: "revoked" again
        click.echo(f"token {info.id} ({info.user}) was already revoked, by {info.revoked_by}")
        return
    click.echo(f"token {info.id} ({info.user}) revoked")
