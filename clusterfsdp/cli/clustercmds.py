"""The commands about the machines rather than one run: `nodes` (the node record's
quarantine), `devcluster` (a local multi-node Slurm) and `tui` (the terminal UI)."""

from __future__ import annotations

import argparse

from . import run_root


def cmd_nodes(args: argparse.Namespace) -> int:
    from ..control import nodescli

    return nodescli.main(args, run_root(args))


def cmd_devcluster(args: argparse.Namespace) -> int:
    from ..control import devcluster

    return devcluster.main([args.action])


def cmd_tui(args: argparse.Namespace) -> int:
    from ..tui import main as tui_main

    args.run_root = str(run_root(args))
    return tui_main(args)
