"""What the commands that read run folders share: a run folder found by its reference (`status`,
`doctor`, `logs`), the runs listed under the run roots (`runs`, `status` without RUN), and
`runs --quiet`, which shell completion calls: run ids from the folders alone. This module
imports nothing of the control plane (tests/test_cli.py counts what `runs --quiet` imports)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..core import runfolder
from ..core.ownership import user_name
from ..core.runfolder import RunFolder
from ..core.runroot import chosen_root, lookup_roots
from . import CliError, lookup_root


def find_folder(args: argparse.Namespace) -> RunFolder:
    """The run folder `args.run` names, for the commands that only read it (status, logs, doctor)."""
    try:
        return runfolder.find_run(args.run, lookup_root(args))
    except runfolder.RunNotFound as e:
        raise CliError(str(e)) from None


def listed(args: argparse.Namespace) -> tuple[list[Path], list[RunFolder]]:
    """(the run roots looked in, the runs found there newest first): --run-root, else
    runroot.lookup_roots(); with --user only the runs whose folders that user owns (alone: yours);
    at most --limit."""
    roots = [chosen_root(args.run_root)] if args.run_root else lookup_roots()
    found = sorted({r for root in roots for r in runfolder.iter_runs(root)}, key=lambda r: r.id, reverse=True)
    if args.user is not None:
        who = args.user or user_name(os.geteuid())
        found = [r for r in found if runfolder.owner(r) == who]
    return roots, found[: args.limit]


def cmd_run_ids(args: argparse.Namespace) -> int:
    """`runs --quiet` (and `status --quiet` without RUN): run ids only, newest first, for scripts
    and shell completion (no Slurm query)."""
    print("\n".join(r.id for r in listed(args)[1]))
    return 0
