"""`clusterfsdp tui`: the terminal UI (compose, queue, logs, run), or with --serve the same app
in a browser via textual-serve, bound to 127.0.0.1 only and behind a token.

Imports nothing heavy: no torch, no transformers, so it starts in well under a second.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

DEFAULT_REFRESH_S = 10.0


def refresh_interval(args: argparse.Namespace) -> float:
    """--refresh if given, else $CLUSTERFSDP_TUI_REFRESH_S, else 10 s (sites often ask for less squeue)."""
    value = getattr(args, "refresh", None) or os.environ.get("CLUSTERFSDP_TUI_REFRESH_S") or DEFAULT_REFRESH_S
    return max(1.0, float(value))


def main(args: argparse.Namespace) -> int:
    """`clusterfsdp tui` and `python -m clusterfsdp.tui`; Textual is imported only here, so the
    rest of the CLI never pays for it."""
    if args.serve:
        # Textual (heavy) only when the TUI runs: `nodes` and `devcluster` share this group
        from .serve import serve

        return serve(Path(args.run_root), args.port, refresh_interval(args), args.allow_origin)
    # Textual (heavy) only when the TUI runs: `nodes` and `devcluster` share this group
    from .app import ClusterApp

    ClusterApp(Path(args.run_root).expanduser(), refresh_s=refresh_interval(args)).run()
    return 0
