"""The commands about the machines rather than one run: `nodes` (the node record's
quarantine), `devcluster` (a local multi-node Slurm) and `tui` (the terminal UI)."""

from __future__ import annotations

import argparse

from ..control import devcluster, nodescli
from ..core.runroot import chosen_root
from ..tui import main as tui_main


def cmd_nodes(args: argparse.Namespace) -> int:
    return nodescli.main(args, chosen_root(args.run_root))


def cmd_devcluster(args: argparse.Namespace) -> int:
    argv = [args.action]
    if args.nodes is not None:
        argv += ["--nodes", str(args.nodes)]
    if args.state is not None:
        argv += ["--state", str(args.state)]
    if args.prefix is not None:
        argv += ["--prefix", args.prefix]
    return devcluster.main(argv)


def cmd_tui(args: argparse.Namespace) -> int:
    args.run_root = str(chosen_root(args.run_root))
    return tui_main(args)
