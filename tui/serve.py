"""`clusterfsdp tui --serve`: the same app in a browser, through textual-serve.

Bound to 127.0.0.1 only, and every request needs the token printed at start (or given in
$CLUSTERFSDP_TUI_TOKEN), a Host naming the loopback and, when a browser sends one, its own
Origin (serve_auth.py says why each). From a laptop, forward the port over SSH:
`ssh -L 8000:127.0.0.1:8000 login-node`, then open the printed http://127.0.0.1:8000/?token=...
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

from aiohttp import web
from textual_serve.server import Server

from .serve_auth import Access, AccessConfigError, from_environment, guard, offline_page

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
        print(
            f"clusterfsdp tui: serving on {self.public_url}/?token={self.access.token}\n"
            f"  (127.0.0.1 only; from a laptop: ssh -L {self.port}:127.0.0.1:{self.port} <this host>, "
            "then open that URL; Ctrl+C stops)",
            flush=True,
        )


def serve(run_root: Path, port: int, refresh_s: float, allow_origins: list[str]) -> int:
    try:
        access = from_environment(allow_origins)
    except AccessConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    GuardedServer(command(run_root, refresh_s), port, access).serve()
    return 0
