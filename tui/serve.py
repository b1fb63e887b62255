"""`clusterfsdp tui --serve`: the same app in a browser, through textual-serve.

Bound to 127.0.0.1 only, and every request needs the token (made at start, or given in
$CLUSTERFSDP_TUI_TOKEN), a Host naming the loopback and, when a browser sends one, its own
Origin (serve_auth.py says why each). The token is written to a 0600 file whose path is printed;
the URL with the token is printed only when the output is a terminal (a log file may be readable
by all). From a laptop, forward the port over SSH: `ssh -L 8000:127.0.0.1:8000 login-node`, then
open http://127.0.0.1:8000/?token=<the token>. A port in use is one line, before anything else.
"""

from __future__ import annotations

import errno
import logging
import shlex
import socket
import sys
from pathlib import Path

from aiohttp import web
from textual_serve.server import Server

from .serve_auth import (
    Access,
    AccessConfigError,
    from_environment,
    guard,
    offline_page,
    remove_token_file,
    write_token_file,
)

HOST = "127.0.0.1"


def command(run_root: Path, refresh_s: float) -> str:
    """The command textual-serve runs for each browser session."""
    return shlex.join(
        [
            sys.executable,
            "-m",
            "clusterfsdp.tui",
            "--run-root",
            str(run_root.expanduser().absolute()),
            "--refresh",
            f"{refresh_s:g}",
        ]
    )


class GuardedServer(Server):
    """textual-serve's Server with the checks of serve_auth in front of every route."""

    def __init__(self, command: str, port: int, access: Access) -> None:
        super().__init__(command, host=HOST, port=port, title="clusterfsdp")
        self.access = access

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(guard(self.access))  # outermost: nothing runs before the checks
        app.middlewares.append(offline_page(self.access, self.public_url))
        return app

    def initialize_logging(self) -> None:
        super().initialize_logging()
        # aiohttp's access log would print each request line, `GET /?token=...` included.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def on_startup(self, app: web.Application) -> None:
        path = write_token_file(self.access)
        shown = f"?token={self.access.token}" if sys.stdout.isatty() else "?token=<the token in that file>"
        print(
            f"clusterfsdp tui: serving on {self.public_url}/{shown}\n"
            f"  token file: {path} (mode 0600)\n"
            f"  (127.0.0.1 only; from a laptop: ssh -L {self.port}:127.0.0.1:{self.port} <this host>, "
            "then open that URL; Ctrl+C stops)",
            flush=True,
        )

    async def on_shutdown(self, app: web.Application) -> None:
        remove_token_file(self.access)


def port_taken(port: int) -> str | None:
    """Why 127.0.0.1:`port` cannot be listened on (as aiohttp will: SO_REUSEADDR), or None."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((HOST, port))
        except OSError as exc:
            return _why(exc)
    return None


def _why(exc: OSError) -> str:
    return "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be listened on ({exc.strerror or exc})"


def serve(run_root: Path, port: int, refresh_s: float, allow_origins: list[str]) -> int:
    try:
        access = from_environment(allow_origins, port)
    except AccessConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    problem = port_taken(port)
    try:
        if problem is None:
            GuardedServer(command(run_root, refresh_s), port, access).serve()
            return 0
    except OSError as exc:  # taken between the probe and the bind
        remove_token_file(access)
        problem = _why(exc)
    except AccessConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"error: --port {port}: {HOST}:{port} {problem}; choose another --port", file=sys.stderr)
    return 2
