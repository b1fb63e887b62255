"""The CLI's sweep commands (`clusterfsdp sweep`, and `status`, `cancel`, `resume`, `runs` given a
sweep), apart from cli.py so that the other commands' start-up imports none of it: cli.py
imports this module only when a command names a sweep (tests/test_cli.py counts the modules).
Each function parses, calls the sweep service (`control.sweep`) and prints."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .control import sweepfolder
from .control.errors import UserError
from .control.sweepfolder import SORT_KEYS, SweepFolder, SweepSummary, sort_key

if TYPE_CHECKING:
    from .control.spec import JobText


def cmd_sweep(args: argparse.Namespace) -> int:
    from .control.sweep import Sweep

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
            print(json.dumps({"schema": 1, "keys": planned.keys, "points": points}, indent=2))
        else:
            for p in planned.points:
                print(f"point {p.index}  {p.describe()}")
            print(f"{len(planned.points)} point(s) checked; nothing queued (--dry-run)", file=sys.stderr)
        return 0
    sweep = Sweep.submit(planned)
    record = sweep.record()
    if args.json:
        print(json.dumps({"schema": 1, "folder": str(sweep.path), **record.to_dict()}, indent=2))
        return 0
    at_once = "one after another" if record.max_parallel <= 1 else f"{record.max_parallel} at a time"
    where = f"job array {record.job_id}" if record.job_id else f"local, {at_once}"
    print(f"sweep {record.sweep_id}  {len(record.points)} points  {where}  folder {sweep.path}")
    for p in record.points:
        print(f"  point {p.index}  run {p.run_id}  {_values(p.values)}")
    return 0


def _values(values: dict[str, Any]) -> str:
    from .control import spec as specmod

    return " ".join(f"{k}={specmod.render_value(v)}" for k, v in values.items())


def cmd_status(args: argparse.Namespace, run_root: Path) -> int:
    from . import term

    folder = _find(args.run, run_root)
    record = folder.record()
    rows, error = folder.statuses()
    sort = args.sort or "index"
    if sort not in (*SORT_KEYS, *record.keys):
        raise UserError(f"--sort {sort}: one of {', '.join([*SORT_KEYS, *record.keys])}")
    rows.sort(key=lambda r: sort_key(sort, r))
    if error:
        print(f"warning: {error}", file=sys.stderr)
    bad = any(r.status.state.bad for r in rows)
    if args.json:
        from .control import jsonout

        doc = {"folder": str(folder.path), **record.to_dict(), "sorted_by": sort, "slurm_error": error}
        doc["points"] = [{**jsonout.to_json(r.status), "index": r.point.index, "values": r.point.values} for r in rows]
        print(jsonout.document(doc))
        return 1 if bad else 0
    where = f"Slurm job array {record.job_id}" if record.job_id else str(record.executor)
    print(f"sweep      {record.sweep_id} ({record.name}), {len(rows)} points, {where}\nfolder     {folder.path}")
    if record.cancelled:
        print("cancelled  no point starts any more (`clusterfsdp resume SWEEP` starts the rest)")
    keys = [(k, max(len(k), *(len(_short(r.point.values.get(k))) for r in rows))) for k in record.keys]
    head = "".join(f"{k:<{w}}  " for k, w in keys)
    print(f"{'POINT':<5}  {'RUN':<24}  {head}{'STATE':<11} {'STEP':>11} {'LOSS':>8} {'EVAL_LOSS':>9}")
    for r in rows:
        st = r.status
        vals = "".join(f"{_short(r.point.values.get(k)):<{w}}  " for k, w in keys)
        step = f"{st.step or 0}/{st.steps or '?'}"
        print(
            f"{r.point.index:<5}  {r.point.run_id:<24}  {vals}{term.state_text(st.state, 11, sys.stdout)} {step:>11} "
            f"{_num(st.loss):>8} {_num(st.eval_loss):>9}"
        )
    return 1 if bad else 0


def _short(value: Any) -> str:
    from .control import spec as specmod

    text = specmod.render_value(value) if value is not None else "-"
    return text if len(text) <= 24 else text[:21] + "..."


def _num(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def _find(ref: str, run_root: Path) -> SweepFolder:
    return sweepfolder.find_sweep(ref, run_root)


def cmd_cancel(args: argparse.Namespace, run_root: Path) -> int:
    from .control.sweep import Sweep

    for line in Sweep(_find(args.run, run_root)).cancel():
        print(line)
    return 0


def cmd_resume(args: argparse.Namespace, run_root: Path) -> int:
    from .control.sweep import Sweep

    if args.step is not None or args.set:
        raise UserError("resume SWEEP resumes every unfinished point as it is: --step and --set are for one run")
    for line in Sweep(_find(args.run, run_root)).resume(executor=args.executor, force=args.force):
        print(line)
    return 0


def sweep_lines(sweeps: list[SweepFolder]) -> list[str]:
    """`runs`: one line per sweep (its points' states counted); `status SWEEP` expands it."""
    from .control.records import RecordError

    out = []
    for folder in sweeps:
        try:
            record = folder.record()
            rows, _ = folder.statuses()
        except RecordError as e:
            out.append(f"{folder.id:<22} {'?':<16} UNREADABLE  {e}")
            continue
        summary = SweepSummary.of(rows)
        keys = ",".join(record.keys)
        what = f"sweep of {len(rows)} ({keys}): {summary.counts}; best {_num(summary.best)}"
        out.append(f"{record.sweep_id:<22} {record.name[:16]:<16} {what}")
    return out


def table_points(job: JobText, overrides: list[str]) -> int:
    """`validate`: how many points the job file's [sweep] table has, each checked as `sweep`
    checks them (SweepError, exit 2, naming the key or the point); 0 without one. `submit`
    refuses a job with one, and `sweep` refused tables that `validate` passed."""
    from .control import sweepplan

    table = sweepplan.read_table(job.text)
    return len(sweepplan.vary(job, overrides=overrides).points) if table.grid or table.zip else 0
