"""`clusterfsdp data prepare | show | status`: a job's data tokenized before it runs (here in a
worker process, or as a Slurm job array), samples of it shown, how far it is prepared. The
tokenizing and reading run in `python -m` subprocesses: the CLI never imports numpy,
transformers or datasets."""

from __future__ import annotations

import argparse
import subprocess
import sys

from ..control import launch, prepjob
from ..core import spec as specmod
from ..core import warmlaunch
from ..core.spec.allowlists import sbatch_name_error
from ..data.checks import source_problems
from . import CliError


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """Tokenize the job's data now (with a progress bar), in a worker process: the CLI itself
    never imports transformers or datasets."""
    if args.executor == "slurm":
        return _data_prepare_array(args)
    argv = [sys.executable, "-m", "clusterfsdp.data.prepare", args.job, "--workers", str(args.workers)]
    for item in args.set or []:
        argv += ["--set", item]
    return subprocess.call(argv)


def _data_prepare_array(args: argparse.Namespace) -> int:
    """`data prepare --executor slurm`: one Slurm job array tokenizes the missing datasets
    (control/prepjob.py); with --follow, its progress until it ends."""
    spec = specmod.load(args.job, args.set or [])
    if errors := source_problems(spec):
        raise specmod.SpecError(errors)
    try:
        minutes = specmod.parse_time_minutes(args.time) if args.time else 0
    except ValueError as e:
        raise CliError(f"--time: {e}") from None
    if problem := sbatch_name_error("--partition", args.partition or ""):
        raise CliError(problem)
    launch.choose_executor("slurm")  # one line when no controller answers
    refs = prepjob.missing(spec)
    if not refs:
        print("the job's data is prepared already")
        return 0
    options = prepjob.ArrayOptions(
        args.nodes or 0, args.array_size or 0, args.partition or "", args.cpus_per_task or 0, minutes
    )
    job_id = prepjob.queue(spec, options, refs, prepjob.cache_folder(spec))
    print(f"queued data prepare array job {job_id} ({options.count(spec)} tasks): `clusterfsdp data status` follows it")
    return prepjob.follow(spec, job_id) if args.follow else 0


def cmd_data_show(args: argparse.Namespace) -> int:
    """Samples of the prepared data with the trained tokens marked (data/show.py), in a worker
    process like `data prepare`: the CLI never imports numpy or the tokenizer. A warm launcher of
    this user forks it when one is named (core/warmlaunch.py: its tokenizer libraries imported)."""
    argv = [sys.executable, "-m", "clusterfsdp.data.show", args.job, "-n", str(args.n), "--split", args.split]
    argv += ["--source", str(args.source)] if args.source is not None else []
    for item in args.set or []:
        argv += ["--set", item]
    return warmlaunch.call(argv)


def cmd_data_status(args: argparse.Namespace) -> int:
    for line in prepjob.status_lines(specmod.load(args.job, args.set or [])):
        print(line)
    return 0
