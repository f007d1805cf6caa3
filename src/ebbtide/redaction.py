"""Secrets out of every log line: a logging filter, the last line of defence.

Messages ebbtide writes name URLs through :func:`ebbtide.config.settings.redacted`
already.  Libraries do not: a driver's error, a broker's reconnect warning or a traceback
may carry a URL with its password, or an API token.  :class:`SecretFilter`, installed on
the handlers of every long-running ``ebb`` process (and on the last-resort handler that
words a short command's warnings), rewrites each record once it is formatted:

- the password of any ``scheme://user:password@host``, and of a ``password=`` (or
  ``sslpassword=``) query parameter, becomes ``***``;
- an API bearer token (``ebt_…``) becomes ``ebt_***``;
- the literal values of the secrets it is given (passwords taken from the process's own
  store and broker URLs) become ``***`` wherever they appear.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit

#: ``scheme://user:password@`` in any text; the password is group 2: everything up to the
#: last ``@`` before a space or a quote, as SQLAlchemy reads a URL (``/`` and ``#`` may
#: stand in a password there, and redis-py's URL parsing takes ``@`` in one); a run that
#: only looks like a password is masked too: masking too much is the safe side
_URL_PASSWORD = re.compile(r"([a-zA-Z][a-zA-Z0-9+.\-]*://[^\s:/@'\"]*:)([^\s'\"]*)(@)")
#: a password given as a URL's query parameter (``redis://h/0?password=…``, libpq's
#: ``?password=…``, which both clients accept); the value is group 2
_QUERY_PASSWORD = re.compile(r"([?&](?:password|sslpassword)=)([^&#\s]+)", re.IGNORECASE)
#: the bearer tokens ``ebb token create`` issues
_TOKEN = re.compile(r"\bebt_[A-Za-z0-9_\-]{8,}")


def scrub(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL passwords, API tokens and the literal ``secrets`` masked."""
    text = _URL_PASSWORD.sub(r"\1***\3", text)
    text = _QUERY_PASSWORD.sub(r"\1***", text)
    text = _TOKEN.sub("ebt_***", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def passwords_of(urls: Iterable[str | None]) -> list[str]:
    """The passwords the ``urls`` carry (raw and percent-decoded), longest first, for
    :class:`SecretFilter` to mask wherever a library prints them on their own."""
    found: set[str] = set()
    for url in urls:
        if not url:
            continue
        passwords = [m.group(2) for m in _URL_PASSWORD.finditer(url)]
        try:
            passwords += query_passwords(urlsplit(url).query)
        except ValueError:
            pass
        for password in passwords:
            if password and len(password) >= 4:  # masking "a" everywhere would garble logs
                found.update({password, unquote(password)})
    return sorted(found, key=len, reverse=True)


def query_passwords(query: str) -> list[str]:
    """The passwords a URL's query gives (``password=``, ``sslpassword=``), as written."""
    return [m.group(2) for m in _QUERY_PASSWORD.finditer("?" + query)]


class SecretFilter(logging.Filter):
    """Rewrites each record's message (and its traceback) with :func:`scrub`."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message, self.secrets)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = scrub(record.exc_text, self.secrets)
        if clean != message:
            record.msg, record.args = clean, None
        return True


def install(secrets: Iterable[str] = (), logger: logging.Logger | None = None) -> SecretFilter:
    """Put a :class:`SecretFilter` on every handler of ``logger`` (the root logger)."""
    target = logger or logging.getLogger()
    flt = SecretFilter(secrets)
    for handler in target.handlers:
        handler.addFilter(flt)
    return flt
