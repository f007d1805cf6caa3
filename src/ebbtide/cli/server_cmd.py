"""``ebb server``: the API a fleet's users call instead of opening the store."""

from __future__ import annotations

import socket
from pathlib import Path

import click

from ebbtide.cli.common import _setup_logging, log, metrics_options
from ebbtide.errors import UserError


def _mode(text: str) -> int:
    try:
        mode = int(text, 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise UserError(f"--socket-mode: expected octal permissions like 0660, got {text!r}")
    return mode


@click.command("server")
@click.option(
    "--listen",
    metavar="HOST:PORT",
    help="Serve HTTP on this address (default 127.0.0.1:8786, unless only --socket is given).",
)
@click.option(
    "--socket",
    "socket_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Also (or only) serve on this Unix socket; callers need no token there.",
)
@click.option(
    "--socket-mode",
    default="0666",
    show_default=True,
    help="Permissions of the socket file. Anyone who can connect is known by the kernel "
    "as who they are, so the default lets everyone on the host connect.",
)
@click.option(
    "--tls-cert", type=click.Path(dir_okay=False, path_type=Path), help="PEM certificate (TCP)."
)
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), help="PEM key (TCP).")
@metrics_options
@click.option("--log-level", default="info", show_default=True)
def server(
    listen: str | None,
    socket_path: Path | None,
    socket_mode: str,
    tls_cert: Path | None,
    tls_key: Path | None,
    metrics_port: int | None,
    metrics_address: str,
    log_level: str,
) -> None:
    """Serve the SDK as an HTTP API (/v1, schema at /openapi.json), so a fleet's users
    submit and control jobs without the database's URL.

    \b
    Callers set EBBTIDE_URL and the CLI and SDK go through the server:
      EBBTIDE_URL=http://HOST:8786          with a bearer token (ebb token create)
      EBBTIDE_URL=unix:///PATH/api.sock     on this host: the kernel says who calls
    The token is read from EBBTIDE_TOKEN, else ~/.config/ebbtide/token (mode 0600).
    Through the socket, qsub and qstat take about a tenth of a second (they load no
    database library: the server reads their command line).

    Owners act on their own jobs, admins (the policy's admins, and root) on all; the
    policy file is read again when it changes.  Off the loopback, give --tls-cert and
    --tls-key: without them tokens cross the network in clear text.  The server opens
    the store as EBBTIDE_DB_URL says, and reads job logs under EBBTIDE_HOME (shared
    with the node agents).
    """
    from ebbtide.api import serve
    from ebbtide.api.app import close_app, create_app
    from ebbtide.config.settings import Settings, redacted
    from ebbtide.metrics import default as default_metrics
    from ebbtide.metrics import serve_metrics

    _setup_logging(log_level)
    if (tls_cert is None) != (tls_key is None):
        raise UserError("--tls-cert and --tls-key go together")
    tls = serve.Tls(tls_cert, tls_key) if tls_cert and tls_key else None
    if tls:
        serve.check_tls(tls)
    mode = _mode(socket_mode)
    if listen is None and socket_path is None:
        listen = serve.DEFAULT_LISTEN
    tcp = unix = None
    inode = 0
    try:
        if listen is not None:
            tcp = serve.bind_tcp(*serve.parse_listen(listen))
        if socket_path is not None:
            unix = serve.bind_unix(socket_path, mode)
            inode = serve.socket_inode(socket_path)
        metrics = default_metrics()
        stop_metrics = (
            serve_metrics(metrics, metrics_address, metrics_port)
            if metrics_port is not None
            else None
        )
        settings = Settings.from_env()
        app = create_app(settings, metrics=metrics)
        try:
            # a trial's trap: a mistyped EBBTIDE_HOME served an empty store, unnamed
            log.info("ebb server: store %s", redacted(settings.db_url))
            _say_where(tcp, socket_path if unix else None, mode, tls is not None)
            serve.ApiServer(app, tcp=tcp, unix=unix, tls=tls).run()
        finally:
            close_app(app)
            if stop_metrics is not None:
                stop_metrics()
    finally:
        for sock in (tcp, unix):
            if sock is not None:
                sock.close()
        if unix is not None and socket_path is not None:
            serve.remove_socket(socket_path, inode)
    log.info("ebb server stopped")


def _say_where(
    tcp: socket.socket | None, socket_path: Path | None, mode: int, secure: bool
) -> None:
    from ebbtide.api.serve import is_loopback

    if tcp is not None:
        host, port = tcp.getsockname()[:2]
        shown = f"[{host}]" if ":" in host else host
        log.info("ebb server: listening on %s://%s:%d", "https" if secure else "http", shown, port)
        if not secure and not is_loopback(tcp):
            log.warning(
                "listening on %s without TLS: bearer tokens cross the network in clear "
                "text; give --tls-cert and --tls-key",
                host,
            )
    if socket_path is not None:
        log.info("ebb server: listening on unix://%s (mode %04o)", socket_path, mode)
