"""The CLI's commands that read a sweep: `status SWEEP`, `doctor SWEEP`, `export SWEEP` (`cli.dispatch`
routes a command here when its reference names a sweep), a sweep's line in `runs`, and following
its points (`sweep --follow`). They read the sweep folder and its points' run folders, never the
sweep service's submit machinery (`sweepcmds` queues and changes sweeps)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..control import cost, doctor, jsonout, status, strictjson, sweepfolder
from ..control.sweepfolder import PointStatus, SweepFolder, SweepSummary, find_sweep, sort_key
from ..core import procs, term
from ..core import spec as specmod
from ..core.errors import UserError
from ..core.records import RecordError, RunState
from ..core.runroot import chosen_root
from . import lookup_root

if TYPE_CHECKING:
    from ..control.status import RunStatus
    from ..core.records import SweepRecord
    from ..core.runfolder import RunFolder


def cmd_status(args: argparse.Namespace) -> int:
    """`status SWEEP`: a line per point, sorted by --sort."""
    folder = find_sweep(args.run, lookup_root(args))
    record = folder.record()
    rows, error = folder.statuses(costs=True)
    sort = sweepfolder.sort_name(args.sort or "index", record.keys, rows)
    rows.sort(key=lambda r: sort_key(sort, r))
    if error:
        print(f"warning: {error}", file=sys.stderr)
    bad = any(r.status.state.bad for r in rows)
    if args.json:
        doc = {"folder": str(folder.path), **record.to_dict(), "sorted_by": sort, "slurm_error": error,
               "cost": _cost_json(rows)}  # fmt: skip
        doc["points"] = [{**jsonout.to_json(r.status), "index": r.point.index, "values": r.point.values} for r in rows]
        print(jsonout.document(doc))
        return 1 if bad else 0
    where = f"Slurm job array {record.job_id}" if record.job_id else str(record.executor)
    print(f"sweep      {record.sweep_id} ({record.name}), {len(rows)} points, {where}\nfolder     {folder.path}")
    if record.cancelled:
        print("cancelled  no point starts any more (`clusterfsdp resume SWEEP` starts the rest)")
    keys = [(k, max(len(k), *(len(_short(r.point.values.get(k))) for r in rows))) for k in record.keys]
    head = "".join(f"{k:<{w}}  " for k, w in keys)
    scores = [(n, n.removeprefix("bench/"), max(9, len(n) - 6)) for n in sweepfolder.shown_scores(rows, sort)]
    bench_head = "".join(f" {label:>{w}}" for _, label, w in scores)  # each point's newest result
    print(f"{'POINT':<5}  {'RUN':<24}  {head}{'STATE':<11} {'STEP':>11} {'LOSS':>8} {'EVAL_LOSS':>9} {'COST':>11}"
          f"{bench_head}")  # fmt: skip
    for r in rows:
        st = r.status
        vals = "".join(f"{_short(r.point.values.get(k)):<{w}}  " for k, w in keys)
        step = f"{st.step or 0}/{st.steps or '?'}"
        bench = "".join(f" {_num(r.bench.scores.get(n) if r.bench else None):>{w}}" for n, _, w in scores)
        print(
            f"{r.point.index:<5}  {r.point.run_id:<24}  {vals}{term.state_text(st.state, 11, sys.stdout)} {step:>11} "
            f"{_num(st.loss):>8} {_num(st.eval_loss):>9} {cost.cell(st.cost, st.on_slurm):>11}{bench}"
        )
    if any(r.status.on_slurm for r in rows):
        used, unknown = sweepfolder.total_cost(rows)
        print(f"cost       {used.gpu_hours:.2f} GPU-h, {used.cpu_hours:.2f} CPU-h, all points together"
              + (f" ({unknown} point(s) unknown)" if unknown else ""))  # fmt: skip
    if cost_error := next((r.status.cost_error for r in rows if r.status.cost_error), ""):
        print(f"warning: cost unknown: {cost_error}", file=sys.stderr)
    return 1 if bad else 0


def _cost_json(rows: list[PointStatus]) -> dict[str, Any]:
    """`status SWEEP --json`'s `cost`: the points' GPU- and CPU-hours together, and how many
    points' cost is unknown."""
    used, unknown = sweepfolder.total_cost(rows)
    return {"gpu_hours": round(used.gpu_hours, 6), "cpu_hours": round(used.cpu_hours, 6), "unknown_points": unknown}


def _short(value: Any) -> str:
    return clip(specmod.render_value(value) if value is not None else "-", 24)


def _why_not(cancelled: float | None) -> str:
    return "the sweep was cancelled" if cancelled else "its local driver is gone: `clusterfsdp resume SWEEP` starts it"


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _num(value: float | None) -> str:
    return f"{value:.4f}" if value is not None else "-"


def sweep_lines(sweeps: list[Path], runs: list[RunFolder]) -> tuple[list[str], list[RunStatus], str]:
    """`runs`: one line per sweep (its points' states counted, the best, what they cost; `status
    SWEEP` expands it), and the statuses of the points and of `runs` (the runs listed apart), all
    from one squeue call and at most two sacct calls (states, costs): (lines, every status, Slurm's error)."""
    records: dict[SweepFolder, SweepRecord | RecordError] = {}
    for folder in map(SweepFolder, sweeps):
        try:
            records[folder] = folder.record()
        except RecordError as e:
            records[folder] = e
    points = [(f, p) for f, r in records.items() if not isinstance(r, RecordError) for p in r.points]
    rows, error = status.statuses([*(f.run_folder(p) for f, p in points), *runs], costs=True)
    mine: dict[SweepFolder, list[PointStatus]] = {}
    for (folder, point), st in zip(points, rows, strict=False):
        mine.setdefault(folder, []).append(PointStatus(point, st))
    out = []
    for folder, record in records.items():
        if isinstance(record, RecordError):
            out.append(f"{folder.id:<22} {'?':<16} UNREADABLE  {record}")
            continue
        swept = mine.get(folder, [])
        what = f"sweep of {len(swept)} ({','.join(record.keys)}): {_summary(swept)}"
        if any(r.status.on_slurm for r in swept):
            used, unknown = sweepfolder.total_cost(swept)
            what += f"; cost {used.short()}" + (f" ({unknown} unknown)" if unknown else "")
        out.append(f"{record.sweep_id:<22} {record.name[:16]:<16} {what}")
    return out, rows, error


def _summary(rows: list[PointStatus]) -> str:
    """The points' states counted and the best one: '2 COMPLETED; best eval_loss 0.8686 (point 1:
    train.lr=0.003)'."""
    summary = SweepSummary.of(rows)
    if summary.best_point is None:
        return f"{summary.counts}; no loss yet"
    point = summary.best_point
    return (
        f"{summary.counts}; best {summary.best_key} {_num(summary.best)} (point {point.index}: "
        f"{clip(values(point.values), 48)})"
    )


def values(values: dict[str, Any]) -> str:
    return " ".join(f"{k}={specmod.render_value(v)}" for k, v in values.items())


def follow(folder: SweepFolder, out: Callable[[str], None] = print, poll_s: float = 2.0) -> int:
    """`sweep --follow`: a line each time a point's state changes, until every point has ended
    (or will never start: the sweep was cancelled, or its local driver is gone), then the sweep
    in a line; 0 when every point completed, 1 otherwise."""
    seen: dict[int, str] = {}
    try:
        while True:
            record = folder.record()
            rows, error = folder.statuses()
            driver = folder.driver()
            startable = not record.cancelled and (driver is None or procs.group_alive(driver))
            for r in rows:
                st = r.status
                line = f"{st.state}{' - ' + st.reason if st.reason else ''}"
                if st.state is RunState.PREPARED:  # a local sweep starts its points in turn
                    line = "waiting to start" if startable else f"not started ({_why_not(record.cancelled)})"
                if seen.get(r.point.index) != line:
                    seen[r.point.index] = line
                    ended = st.state.final and st.state is not RunState.PREPARED
                    loss = f" (loss {_num(st.loss)}, step {st.step or 0}/{st.steps or '?'})" if ended else ""
                    shown = clip(values(r.point.values), 48)
                    out(f"point {r.point.index} ({shown}) run {r.point.run_id}: {line}{loss}")
            unstarted = [r for r in rows if r.status.state is RunState.PREPARED]
            if not error and all(r.status.state.final for r in rows) and not (unstarted and startable):
                break
            time.sleep(poll_s)
    except KeyboardInterrupt:
        out(f"stopped following; the sweep goes on (clusterfsdp cancel {folder.id} stops it)")
        return 130
    out(f"sweep {folder.id}: {_summary(rows)}")
    return 0 if all(r.status.state is RunState.COMPLETED for r in rows) else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    """`doctor SWEEP`: each point's verdict, the doctor's short block under each failed one."""
    folder = find_sweep(args.run, chosen_root(args.run_root))
    record = folder.record()
    rows, error = folder.statuses()
    if error:
        print(f"warning: {error}", file=sys.stderr)
    found = {r.point.index: doctor.diagnose(r.status.run, r.status.events, r.status.state.live, r.status.state,
                                            r.status.reason) for r in rows}  # fmt: skip
    if args.json:
        points = [{"index": r.point.index, "run_id": r.point.run_id, "values": r.point.values,
                   "state": str(r.status.state), **found[r.point.index].to_dict()} for r in rows]  # fmt: skip
        print(strictjson.dumps({"schema": 1, "sweep_id": record.sweep_id, "points": points}))
        return 0
    print(f"sweep      {record.sweep_id} ({record.name}), {len(rows)} points\nfolder     {folder.path}")
    for r in rows:
        d = found[r.point.index]
        print(f"\npoint {r.point.index}  run {r.point.run_id}  {values(r.point.values)}  {r.status.state}")
        if r.status.state.bad or d.finding is doctor.Finding.HANG:
            print("\n".join(f"  {line}" for line in d.render(short=True)))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    """`export SWEEP`: a sweep has no weights of its own; the error says which runs have."""
    folder = find_sweep(args.run, chosen_root(args.run_root))
    record = folder.record()
    rows, _ = folder.statuses()
    summary = SweepSummary.of(rows)  # the same best as `runs` and `sweep --follow` name
    best = summary.best_point
    hint = (
        f"e.g. the best, point {best.index} ({summary.best_key} {_num(summary.best)}): clusterfsdp export "
        f"{best.run_id} --to DIR; "
        if best is not None
        else ""
    )
    runs = ", ".join(f"{r.point.index}: {r.point.run_id} ({values(r.point.values)})" for r in rows)
    raise UserError(
        f"{record.sweep_id} is a sweep of {len(rows)} points, not a run: export one point's run, {hint}"
        f"its points: {runs}"
    )
