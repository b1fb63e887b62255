"""The IPython extension: `%load_ext clusterfsdp`, then

    %clusterfsdp srun job.toml --nodes 2 [--gpus-per-node G] [--set train.steps=50] [--all-ranks] [--overlap] [--local]
    %clusterfsdp submit job.toml [--executor auto|slurm|local] [--set KEY=VALUE]

`srun` is `clusterfsdp.notebook.srun` (live output, progress, the stop button cancels the step)
and returns its SrunResult; `submit` queues a batch job like `clusterfsdp submit` and returns the
Submission. `r = %clusterfsdp srun job.toml` keeps the result.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class

from ..api import submit
from ..control.run import GRACE_S
from .step import srun


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as IPython UsageErrors instead of exiting the kernel."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message}\n{self.format_usage().strip()}")

    def exit(self, status: int = 0, message: str | None = None):
        if message:
            raise UsageError(message.strip())
        raise _Done()


class _Done(Exception):
    """--help was printed."""


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%clusterfsdp", description="Launch a clusterfsdp job.toml from a notebook.")
    sub = p.add_subparsers(dest="command", parser_class=_Parser)
    s = sub.add_parser("srun", help="train as a job step of this kernel's allocation (local processes without Slurm)")
    s.add_argument("job", help="job.toml")
    s.add_argument("--nodes", type=int, help="nodes of the step (default: the job's slurm.nodes)")
    s.add_argument("--gpus-per-node", type=int, help="GPUs per node (one task each; default: the job's)")
    s.add_argument("--tasks-per-node", type=int, help="tasks per node (default: the job's)")
    s.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key (repeatable)")
    s.add_argument("--all-ranks", action="store_true", help="stream every rank's output (default: rank 0)")
    s.add_argument("--overlap", action="store_true", help="srun --overlap: share resources with running steps")
    s.add_argument("--local", action="store_true", help="local processes on this machine, even inside an allocation")
    s.add_argument("--no-progress", action="store_true", help="no in-place progress display")
    s.add_argument(
        "--grace",
        type=float,
        default=GRACE_S,
        help=f"seconds to save after the stop button before SIGKILL (default {GRACE_S:g})",
    )
    s.add_argument(
        "--srun-arg",
        action="append",
        default=[],
        metavar="OPTION",
        help="extra srun option, e.g. --srun-arg=--nodelist=node2 (repeatable)",
    )
    b = sub.add_parser("submit", help="queue a batch job like `clusterfsdp submit` (sbatch, or the local executor)")
    b.add_argument("job", help="job.toml")
    b.add_argument("--executor", choices=["auto", "slurm", "local"], default="auto")
    b.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a key (repeatable)")
    return p


@magics_class
class ClusterFsdpMagics(Magics):
    @line_magic
    def clusterfsdp(self, line: str):
        """%clusterfsdp srun JOB [--nodes N] [--gpus-per-node G] [--set K=V] [--all-ranks] [--overlap] [--local]
        %clusterfsdp submit JOB [--executor auto|slurm|local] [--set K=V]"""
        p = parser()
        try:
            args = p.parse_args(shlex.split(line))
        except _Done:
            return None
        if args.command is None:
            print(p.format_help())
            return None
        # A UserError (bad job file, refused submission, no allocation) shows as its message
        # alone: every UserError renders itself in IPython (control.errors).
        if args.command == "srun":
            return srun(
                args.job,
                nodes=args.nodes,
                gpus_per_node=args.gpus_per_node,
                tasks_per_node=args.tasks_per_node,
                overrides=args.set,
                all_ranks=args.all_ranks,
                overlap=args.overlap,
                launcher="local" if args.local else "auto",
                srun_args=args.srun_arg,
                progress=False if args.no_progress else None,
                grace_s=args.grace,
            )
        sub = submit(args.job, executor=args.executor, overrides=args.set)
        print(sub.notice, file=sys.stderr)
        print(
            f"run {sub.run.id}  job {sub.job_id}  folder {sub.run.path}\n"
            f"follow it with: clusterfsdp logs {sub.run.path} -f   (status: clusterfsdp status {sub.run.path})"
        )
        return sub


def load_ipython_extension(ipython) -> None:
    ipython.register_magics(ClusterFsdpMagics)
