"""The CLI's commands that queue or change a sweep: `sweep`, and `cancel`, `resume`, `bench` given a
sweep (`cli.dispatch` routes a command here when its reference names a sweep). Each function
parses, calls the sweep service (`control.sweep`) and prints; `sweepview` shows sweeps."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..control import benchrun, strictjson
from ..control.run import Run
from ..control.sweep import Sweep
from ..control.sweepfolder import find_sweep
from ..core.errors import UserError
from . import lookup_root
from .sweepview import clip, follow, values

__all__ = ["follow"]  # `sweep --follow`'s loop, with the sweep commands (tests call it from here)


def cmd_sweep(args: argparse.Namespace) -> int:
    planned = Sweep.plan(
        args.job,
        grid=args.grid or [],
        zipped=args.zip or [],
        max_parallel=args.max_parallel,
        overrides=args.set or [],
        executor=args.executor,
    )
    print(planned.notice, file=sys.stderr)
    if args.dry_run:
        if args.json:
            points = [{"index": p.index, "values": p.values} for p in planned.points]
            print(strictjson.dumps({"schema": 1, "keys": planned.keys, "points": points}))
        else:
            for p in planned.points:
                print(f"point {p.index}  {p.describe()}")
            print(f"{len(planned.points)} point(s) checked; nothing queued (--dry-run)", file=sys.stderr)
        return 0
    sweep = Sweep.submit(planned)
    record = sweep.record()
    if args.json:
        print(strictjson.dumps({"schema": 1, "folder": str(sweep.path), **record.to_dict()}), flush=True)
        return follow(sweep.folder, lambda line: print(line, file=sys.stderr, flush=True)) if args.follow else 0
    at_once = "one after another" if record.max_parallel <= 1 else f"{record.max_parallel} at a time"
    where = f"job array {record.job_id}" if record.job_id else f"local, {at_once}"
    print(f"sweep {record.sweep_id}  {len(record.points)} points  {where}  folder {sweep.path}")
    for p in record.points:
        print(f"  point {p.index}  run {p.run_id}  {values(p.values)}")
    return follow(sweep.folder) if args.follow else 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """`cancel SWEEP`: every point's live attempt, and no point starts any more."""
    for line in Sweep(find_sweep(args.run, lookup_root(args))).cancel():
        print(line)
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    """`resume SWEEP`: every unfinished point, as it is."""
    if args.step is not None or args.set:
        raise UserError("resume SWEEP resumes every unfinished point as it is: --step and --set are for one run")
    for line in Sweep(find_sweep(args.run, lookup_root(args))).resume(executor=args.executor, force=args.force):
        print(line)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """`bench SWEEP [--step N | --all]`: each point's benchmarks in turn, as `bench RUN` runs
    them (control/benchrun.py). A point that has nothing to evaluate (no checkpoint, no step N, no
    [benchmarks]) is a line and the others go on; so is an evaluation that fails (recorded for
    `doctor`, as for a run). Exit 1 when an evaluation failed, else 0."""
    if args.all and args.step is not None:
        raise UserError("bench: give --step or --all, not both")
    folder = find_sweep(args.run, lookup_root(args))
    record = folder.record()
    evaluated, skipped, failed = 0, 0, 0
    for point in record.points:
        run = Run(folder.run_folder(point))
        head = f"point {point.index} ({clip(values(point.values), 48)}) run {point.run_id}"
        try:
            steps = benchrun.steps_to_run(run, args.step, args.all)
        except UserError as e:  # RunError: no checkpoint (yet), no [benchmarks]; SpecError: its job.toml
            print(f"{head}: skipped: {e}", flush=True)
            skipped += 1
            continue
        if not steps:
            print(f"{head}: every checkpoint has its benchmarks already", flush=True)
        for step in steps:
            try:
                document = _evaluate(run, step, head, again=not (args.all or args.if_missing))
                print(f"{head}: {benchrun.describe(step, document)}")
                evaluated += bool(document)
            except UserError as e:
                print(f"{head}: error: {e}", file=sys.stderr, flush=True)
                failed += 1
    print(f"sweep {record.sweep_id}: {evaluated} evaluated, {failed} failed, {skipped} point(s) skipped")
    return 1 if failed else 0


def _evaluate(run: Run, step: int, head: str, *, again: bool) -> dict[str, Any] | None:
    """One point's evaluation of `step`, as `bench RUN --step N` evaluates it (control/benchrun.py):
    under the step's lock, waiting for one under way (None: unless `again`, it landed meanwhile)."""
    return benchrun.evaluate_once(run, step, lambda line: print(f"{head}: {line}", flush=True), again=again)
