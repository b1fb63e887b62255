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

    argv = [args.action]
    if args.nodes is not None:
        argv += ["--nodes", str(args.nodes)]
    if args.state is not None:
        argv += ["--state", str(args.state)]
    if args.prefix is not None:
        argv += ["--prefix", args.prefix]
    return devcluster.main(argv)


def cmd_tui(args: argparse.Namespace) -> int:
    from ..tui import main as tui_main

    args.run_root = str(run_root(args))
    return tui_main(args)
