"""The commands that show runs' states: `runs` and `status` (of a run; `sweepview` shows a
sweep's). They read run folders and Slurm's job table without the run service's submit
machinery (launch, hub, modelsource, data checks) or the spec's schema: both are
start-up-critical (tests/test_cli.py counts their modules, bench/startup_bench.py times them)."""

from __future__ import annotations

import argparse
import sys
import time

from ..control import cost, jsonout, pending, status
from ..core import benchresults, records, term
from ..core.numbers import perplexity
from ..core.records import EventKind, RunState
from ..core.runfolder import RunFolder
from ..data import samplestats
from .folders import find_folder, listed


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    secs = time.time() - ts
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= n:
            return f"{int(secs // n)}{unit} ago"
    return f"{int(secs)}s ago"


def cmd_runs(args: argparse.Namespace) -> int:
    """`runs`: a line per run (a sweep's points in one line), what each user's runs cost."""
    roots, found = listed(args)  # (--quiet: folders.cmd_run_ids)
    swept = [] if args.json else sorted({r.path.parent for r in found if (r.path.parent / "sweep.json").is_file()},
                                        reverse=True)  # fmt: skip
    plain = [r for r in found if r.path.parent not in swept]
    if not found and not args.json:
        print(f"no runs under {' or '.join(map(str, roots))} (--run-root, or set $CLUSTERFSDP_RUN_ROOT)")
        return 0
    if swept:  # a sweep is one line (`status SWEEP` lists its points); ONE squeue and sacct for all
        from . import sweepview  # only when a sweep is listed: it brings the spec's schema (start-up of `runs`)

        lines, every, error = sweepview.sweep_lines(swept, plain)
        print("\n".join(lines))
        rows = every[len(every) - len(plain) :]
    else:
        rows, error = status.statuses(found, costs=True)
        every = rows
    if error:
        print(f"warning: {error}", file=sys.stderr)
    if unknown := next((st.cost_error for st in every if st.cost_error), ""):
        print(f"warning: cost unknown (?): {unknown}", file=sys.stderr)
    by_user = status.cost_by_user(every)
    if args.json:
        sys.stdout.writelines(jsonout.listing(rows, error, {u: c.to_json() for u, c in by_user.items()}))
        return 0
    if rows:
        print(f"{'RUN':<22} {'NAME':<16} {'STATE':<11} {'STEP':>11} {'LOSS':>8} {'COST':>11} {'JOB':<14} CREATED")
    for st in rows:
        step = f"{st.step or 0}/{st.steps or '?'}"
        loss = f"{st.loss:.4f}" if st.loss is not None else "-"
        job = f"{st.executor}:{st.job_id}" if st.job_id else "-"
        created = _age(st.created)
        state = term.state_text(st.state, 11, sys.stdout)
        spent = cost.cell(st.cost, st.on_slurm)
        print(f"{st.run.id:<22} {st.run.name[:16]:<16} {state} {step:>11} {loss:>8} {spent:>11} {job:<14} {created}")
    for user, used in by_user.items():  # what each user's listed runs cost together
        print(f"cost       {user}: {used.line()}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    """`status RUN` (`status SWEEP`: sweepview.cmd_status; without RUN: `runs`)."""
    if not args.run:
        return cmd_runs(args)
    folder = find_folder(args)
    st = status.run_status(folder)
    status.with_costs([st])
    if args.json:
        print(jsonout.document(st))
        return 1 if st.state.bad else 0
    print(f"run        {folder.id} ({folder.name})\nfolder     {folder.path}")
    print(f"state      {term.state_text(st.state, 0, sys.stdout)}{' - ' + st.reason if st.reason else ''}")
    if st.state is RunState.UNREADABLE:
        return 1
    if st.state is RunState.PENDING and st.executor == "slurm" and st.job_id:
        _why_waiting(folder, st.job_id)
    print(
        f"progress   step {st.step or 0}/{st.steps or '?'}"
        + (f", epoch {st.epoch:.2f}" if st.epoch is not None else "")
        + (f", loss {st.loss:.4f}" if st.loss is not None else "")
        + (f", reward accuracy {st.reward_accuracy:.2f}" if st.reward_accuracy is not None else "")
        + (
            f", reward margin {st.reward_margin:.4f}, kl {st.kl:.4f}"
            if st.kl is not None and st.reward_margin is not None
            else ""
        )
    )
    if st.eval_loss is not None:
        ppl = f", perplexity {perplexity(st.eval_ppl)}" if st.eval_ppl is not None else ""
        rewards = f", reward accuracy {st.eval_reward_accuracy:.2f}" if st.eval_reward_accuracy is not None else ""
        print(f"eval       step {st.eval_step}: eval_loss {st.eval_loss:.4f}{ppl}{rewards}")
    for line in samplestats.lines(folder.data_file):
        print(f"data       {line}")
    spent = st.cost
    sizes = records.attempt_sizes(st.events)  # each incarnation's nodes x ranks (a node range: as it started)
    for a in st.attempts:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(a.submitted))
        print(f"attempt {a.attempt}  {a.executor} job {a.job_id}  {when}  {a.reason}")
        for (job, restart), size in sizes.items():
            if job == a.job_id:
                print(f"  size     (restart {restart}) {size}")
        for end in (e for e in st.ends if e.job_id == a.job_id):
            print(f"  ended    (restart {end.restart}) {end.describe()}")
        if spent is not None and a.job_id in spent.attempts:
            used = spent.attempts[a.job_id]
            print(f"  cost     {used.gpu_hours:.2f} GPU-h, {used.cpu_hours:.2f} CPU-h")
    if spent is not None or st.cost_error:
        print(f"cost       {spent.line() if spent is not None else f'unknown: {st.cost_error}'}")
    for note in st.notes:
        print(f"note       {note}")
    shown = {EventKind.FAILED, EventKind.RESUMED, EventKind.CHECKPOINT_FALLBACK}  # ends: under each attempt
    for e in st.events:
        if e.event in shown:
            detail = e.reason or e.checkpoint
            at = time.strftime("%H:%M:%S", time.localtime(e.time))
            print(f"event      {at} job {e.job_id} {e.event} {detail}".rstrip())
    print(f"checkpoints {', '.join(f'step {c}' for c in st.checkpoints) or 'none'}")
    if (folder.path / "benchmarks").is_dir():  # [benchmarks]
        _benchmark_lines(folder)
    if st.state.bad or st.state.live:  # why it failed or hangs, in short (`clusterfsdp doctor RUN` says more)
        from ..control import doctor  # a failed or live run only: the doctor's rules are the biggest import here

        found = doctor.diagnose(folder, st.events, st.state.live, st.state, st.reason)
        if st.state.bad or found.finding is doctor.Finding.HANG:
            print("\n".join(found.render(short=True)))
    return 1 if st.state.bad else 0


def _benchmark_lines(folder: RunFolder) -> None:
    """The newest benchmark scores (stderr columns left out) and how many evaluations failed."""
    for row in benchresults.rows(folder)[-1:]:
        scores = ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k.startswith("bench/") and "_stderr" not in k)
        print(f"benchmark  step {row['step']}: {scores}")
    if failed := benchresults.failures(folder):
        print(f"benchmark  {len(failed)} evaluation(s) failed (`clusterfsdp doctor {folder.id}`)")


def _why_waiting(folder: RunFolder, job_id: str) -> None:
    """A pending Slurm job: when the scheduler expects it to start, and what would start it
    sooner (fewer nodes or another partition free now; a shorter time limit, as Slurm's test of
    the job's own batch script says)."""
    when = pending.expected_start(job_id)
    said = f"start {when} (Slurm's estimate)" if when else "no estimate yet (Slurm makes one each backfill cycle)"
    print(f"expected   {said}")
    spec = folder.spec()
    for tip in pending.sooner(spec):
        print(f"sooner     {tip}")
    script = folder.submitit_dir / job_id / f"{job_id}_submission.sh"
    if when and script.is_file() and (tip := pending.shorter_time(script, spec.time_minutes, when)):
        print(f"sooner     {tip}: `clusterfsdp resume {folder.id} --force` with it requeues it so")
