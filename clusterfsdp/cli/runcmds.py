"""The run service's verbs: `submit`, `resume`, `cancel`, `rm`, `export` and `bench` (a run
queued, changed or read out through `control.run.Run`; given a sweep, `sweepcmds` does it for
each point, `cli.dispatch` routing there)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..control import benchrun, jsonout, pending
from ..control.run import Run, RunError, Submission
from ..control.sweepplan import has_table
from ..core import slurmping
from ..core import spec as specmod
from ..core.runroot import chosen_root
from . import EXIT_BAD_INPUT, CliError, lookup_root
from .diagcmds import follow


def _find(args: argparse.Namespace) -> Run:
    """The run `args.run` names, through the run service (these commands change it)."""
    return Run.find(args.run, lookup_root(args))


def cmd_submit(args: argparse.Namespace) -> int:
    spec = specmod.load(args.job, args.set or [])
    if has_table(Path(args.job)):
        raise CliError(f"{args.job} has a [sweep] table: `clusterfsdp sweep {args.job}` runs its points")
    if args.dry_run:
        if args.parsable:
            raise CliError("--parsable prints a job id, and a dry run queues no job (use --json)")
        run, script = Run.dry_run(spec)
        print(jsonout.document(run.status()) if args.json else script)
        print(
            f"# run folder prepared: {run.path}\n# submit by hand with: sbatch {run.folder.sbatch_script}",
            file=sys.stderr,
        )
        if _slurm_answers():
            print(f"# would start {pending.would_start(run.folder.sbatch_script)}", file=sys.stderr)
            if tip := pending.shorter_time(run.folder.sbatch_script, spec.time_minutes):
                print(f"# sooner: {tip}", file=sys.stderr)
        return 0
    sub = Run.submit(spec, args.executor)
    print(sub.notice, file=sys.stderr)
    for n in [*spec.notices(), *sub.notes]:
        print(f"note: {n}", file=sys.stderr)
    _print_submission(sub, args, f"run {sub.run.id}  job {sub.job_id}  folder {sub.run.path}")
    if args.follow:
        return follow(sub.run.folder, 0, sub.job_id)
    return 0


def _slurm_answers() -> bool:
    return slurmping.controller() == "up"


def _print_submission(sub: Submission, args: argparse.Namespace, line: str) -> None:
    """The queued attempt on stdout: a line for people, `--json`, or `--parsable` (the job id
    alone, as `sbatch --parsable` prints it, for JOB=$(clusterfsdp submit --parsable ...))."""
    if args.parsable:
        print(sub.job_id, flush=True)
    elif args.json:
        print(jsonout.document(sub), flush=True)
    else:
        print(line, flush=True)


def cmd_cancel(args: argparse.Namespace) -> int:
    print(_find(args).cancel())
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    run = _find(args)
    sub = run.resume(
        step=args.step,
        overrides=args.set or [],
        executor=args.executor,
        force=args.force,
        without_secrets=args.without_secrets,
    )
    for note in sub.notes:
        print(f"note: {note}", file=sys.stderr)
    origin = f"step {sub.resume_step}" if sub.resume_step is not None else "scratch (no checkpoint)"
    _print_submission(sub, args, f"run {run.id}  job {sub.job_id}  resumes from {origin}")
    if args.follow:
        return follow(run.folder, 0, sub.job_id)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Remove runs (Run.remove refuses live runs and other users' runs); exit 2 if any was refused."""
    root = chosen_root(args.run_root)
    runs = [Run.find(ref, lookup_root(args)) for ref in args.run]
    if args.prepared:
        runs += [r for r in Run.all(root) if r.folder.record().last is None and r not in runs]
    if not runs:
        raise CliError("nothing to remove: name runs, or --prepared for the dry runs never submitted")
    refused = 0
    for run in runs:
        try:
            print(run.remove())
        except RunError as e:
            refused += 1
            print(f"error: {e}", file=sys.stderr)
    return EXIT_BAD_INPUT if refused else 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.best and args.step is not None:
        raise CliError("export: give --step or --best, not both")
    return _find(args).export(Path(args.to), args.step, args.dtype, args.force, best=args.best, merge=args.merge)


def cmd_bench(args: argparse.Namespace) -> int:
    """lm-eval on checkpoints of a run (control/benchrun.py): each result printed as it lands."""
    if args.all and args.step is not None:
        raise CliError("bench: give --step or --all, not both")
    run = _find(args)
    steps = benchrun.steps_to_run(run, args.step, args.all)
    if not steps:
        print(f"run {run.id}: every checkpoint has its benchmarks already (--step N evaluates one again)")
    for step in steps:
        document = benchrun.evaluate_once(
            run, step, lambda line: print(line, flush=True), again=not (args.all or args.if_missing)
        )
        print(benchrun.describe(step, document), flush=True)
    return 0
