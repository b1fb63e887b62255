"""`clusterfsdp tui --serve`: the same app in a browser, through textual-serve.

Bound to 127.0.0.1 only: textual-serve has no authentication, and on a shared login node any
user could otherwise drive your jobs. From a laptop, forward the port over SSH:
`ssh -L 8000:127.0.0.1:8000 login-node`, then open http://127.0.0.1:8000.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

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


def serve(run_root: Path, port: int, refresh_s: float) -> int:
    from textual_serve.server import Server

    Server(command(run_root, refresh_s), host=HOST, port=port, title="clusterfsdp").serve()
    return 0
