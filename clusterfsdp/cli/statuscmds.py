"""The commands that read run folders: `runs`, `status`, `doctor` and `logs` (and following a
rank's log, which `submit -f` and `resume -f` share). They read the run folder without the run
service's submit machinery (launch, hub, modelsource, data checks): `status` and `runs` are
start-up-critical (tests/test_cli.py counts their modules)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from . import CliError, json_text, lookup_root, names_sweep, run_root

if TYPE_CHECKING:
    from ..core.runfolder import RunFolder


def find_folder(args: argparse.Namespace) -> RunFolder:
    """The run folder, for the commands that only read it (status, logs)."""
    from ..core import runfolder

    try:
        return runfolder.find_run(args.run, lookup_root(args))
    except runfolder.RunNotFound as e:
        raise CliError(str(e)) from None


def log_output(path: Path):
    """Where a log's own bytes go: as they are (as `cat` shows them: progress bars, colours) when only
    you could have written the file; escaped like every other line (`term.SafeStream`) when another
    user could have (a run of theirs in a shared run root: escape sequences in it would drive your
    terminal)."""
    from ..core import ownership, term

    return term.raw(sys.stdout) if ownership.path_clause(path) is None else sys.stdout


def follow(run, rank: int, job_id: str | None = None) -> int:
    """Stream a rank's log until the run ends (from attempt `job_id` on, if given)."""
    from ..control import logs

    def done() -> bool:
        return run.status().state.final

    own = log_output(run.folder.path / "logs")
    try:
        for text in logs.follow(run.folder, rank, done, job_id=job_id):
            out = sys.stdout if isinstance(text, logs.Banner) else own  # the log's own bytes: raw if yours
            out.write(text)
            out.flush()
    except KeyboardInterrupt:
        print(f"\nstopped following; the run goes on (clusterfsdp cancel {run.id} stops it)", file=sys.stderr)
        return 130
    st = run.status()
    print(f"run {run.id}: {st.state}{' - ' + st.reason if st.reason else ''}", file=sys.stderr)
    return 0 if st.state == "COMPLETED" else 1


def _age(ts: float | None) -> str:
    import time

    if not ts:
        return "-"
    secs = time.time() - ts
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= n:
            return f"{int(secs // n)}{unit} ago"
    return f"{int(secs)}s ago"


def cmd_runs(args: argparse.Namespace) -> int:
    from ..core import runfolder
    from ..core.runroot import lookup_roots

    roots = [run_root(args)] if args.run_root else lookup_roots()
    found = sorted({r for root in roots for r in runfolder.iter_runs(root)}, key=lambda r: r.id, reverse=True)
    if args.user is not None:  # the runs whose folders a user owns (`--user` alone: yours)
        from ..control.status import owner
        from ..core.ownership import user_name

        who = args.user or user_name(os.geteuid())
        found = [r for r in found if owner(r) == who]
    found = found[: args.limit]
    if args.quiet:  # run ids only: for scripts and shell completion (no Slurm query)
        print("\n".join(r.id for r in found))
        return 0
    swept = [] if args.json else sorted({r.path.parent for r in found if (r.path.parent / "sweep.json").is_file()},
                                        reverse=True)  # fmt: skip
    plain = [r for r in found if r.path.parent not in swept]
    if not found and not args.json:
        print(f"no runs under {' or '.join(map(str, roots))} (--run-root, or set $CLUSTERFSDP_RUN_ROOT)")
        return 0
    from ..control import cost, status
    from ..core import term

    if swept:  # a sweep is one line (`status SWEEP` lists its points); ONE squeue and sacct for all
        from ..control.sweepfolder import SweepFolder
        from . import sweepcmds

        lines, every, error = sweepcmds.sweep_lines([SweepFolder(p) for p in swept], plain)
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
        from ..control import jsonout

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
    if not args.run:
        return cmd_runs(args)
    if names_sweep(args):
        from . import sweepcmds

        return sweepcmds.cmd_status(args, lookup_root(args))
    from datetime import datetime

    from ..control import status
    from ..core import records, term
    from ..core.records import EventKind, RunState
    from ..data import samplestats

    folder = find_folder(args)
    st = status.run_status(folder)
    status.with_costs([st])
    if args.json:
        print(json_text(st))
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
        from ..core.numbers import perplexity

        ppl = f", perplexity {perplexity(st.eval_ppl)}" if st.eval_ppl is not None else ""
        rewards = f", reward accuracy {st.eval_reward_accuracy:.2f}" if st.eval_reward_accuracy is not None else ""
        print(f"eval       step {st.eval_step}: eval_loss {st.eval_loss:.4f}{ppl}{rewards}")
    for line in samplestats.lines(folder.data_file):
        print(f"data       {line}")
    spent = st.cost
    sizes = records.attempt_sizes(st.events)  # each incarnation's nodes x ranks (a node range: as it started)
    for a in st.attempts:
        when = datetime.fromtimestamp(a.submitted).strftime("%Y-%m-%d %H:%M:%S")
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
            print(f"event      {datetime.fromtimestamp(e.time):%H:%M:%S} job {e.job_id} {e.event} {detail}".rstrip())
    print(f"checkpoints {', '.join(f'step {c}' for c in st.checkpoints) or 'none'}")
    if (folder.path / "benchmarks").is_dir():  # [benchmarks] (its reader imported only then: start-up)
        _benchmark_lines(folder)
    if st.state.bad or st.state.live:  # why it failed or hangs, in short (`clusterfsdp doctor RUN` says more)
        from ..control import doctor

        found = doctor.diagnose(folder, st.events, st.state.live, st.state, st.reason)
        if st.state.bad or found.finding is doctor.Finding.HANG:
            print("\n".join(found.render(short=True)))
    return 1 if st.state.bad else 0


def _benchmark_lines(folder: RunFolder) -> None:
    """The newest benchmark scores (stderr columns left out) and how many evaluations failed."""
    from ..core import benchresults

    for row in benchresults.rows(folder)[-1:]:
        scores = ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k.startswith("bench/") and "_stderr" not in k)
        print(f"benchmark  step {row['step']}: {scores}")
    if failed := benchresults.failures(folder):
        print(f"benchmark  {len(failed)} evaluation(s) failed (`clusterfsdp doctor {folder.id}`)")


def _why_waiting(folder: RunFolder, job_id: str) -> None:
    """A pending Slurm job: when the scheduler expects it to start, and what would start it
    sooner (fewer nodes or another partition free now; a shorter time limit, as Slurm's test of
    the job's own batch script says)."""
    from ..control import pending

    when = pending.expected_start(job_id)
    said = f"start {when} (Slurm's estimate)" if when else "no estimate yet (Slurm makes one each backfill cycle)"
    print(f"expected   {said}")
    spec = folder.spec()
    for tip in pending.sooner(spec):
        print(f"sooner     {tip}")
    script = folder.submitit_dir / job_id / f"{job_id}_submission.sh"
    if when and script.is_file() and (tip := pending.shorter_time(script, spec.time_minutes, when)):
        print(f"sooner     {tip}: `clusterfsdp resume {folder.id} --force` with it requeues it so")


def cmd_doctor(args: argparse.Namespace) -> int:
    if names_sweep(args):
        from . import sweepcmds

        return sweepcmds.cmd_doctor(args, run_root(args))

    from ..control import doctor, status, strictjson
    from ..core import benchresults

    folder = find_folder(args)
    st = status.run_status(folder)
    found = doctor.diagnose(folder, st.events, st.state.live, st.state, st.reason)
    failed = benchresults.failures(folder)  # evaluations never fail the run: their own finding
    if args.json:
        print(strictjson.dumps({"schema": 1, **found.to_dict(), "benchmarks_failed": failed}))
        return 0
    print(f"run        {folder.id} ({folder.name})")
    print("\n".join(found.render()))
    for f in failed:
        print(f"benchmark  step {f['step']} failed: {f.get('error', '')}")
        print(f"           (training is not affected; after a fix: clusterfsdp bench {folder.id} --step {f['step']})")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from ..control import logs

    folder = find_folder(args)
    if args.follow:
        from ..control.run import Run

        return follow(Run(folder), args.rank)
    path = logs.log_file(folder, args.rank, args.attempt)
    if path is None:
        have = ", ".join(logs.attempt_keys(folder)) or "none"
        raise CliError(f"run {folder.id}: no log for rank {args.rank} yet (attempts: {have})")
    text = logs.tail(path, args.lines)
    task = logs.task_log(folder, path, args.rank) if not text else None
    if task is not None:  # the rank wrote nothing itself: submitit's log of its task, and what the doctor says
        print(f"run {folder.id}: rank {args.rank} wrote nothing to its log ({path}); submitit's log of its task, "
              f"{task}:", file=sys.stderr)  # fmt: skip
        _say_why_the_rank_ended(folder, path.parent.name, args.rank)
        text = logs.tail(task, args.lines)
    elif not text:
        print(f"run {folder.id}: rank {args.rank}'s log is empty so far ({path})", file=sys.stderr)
        return 0
    print(text, file=log_output(path))  # the log's own bytes, as `cat` shows them (if yours)
    return 0


def _say_why_the_rank_ended(folder: RunFolder, key: str, rank: int) -> None:
    """The doctor's verdict on the incarnation `key` when it names this rank (a rank killed
    before it wrote anything), on stderr."""
    from ..control import doctor

    job_id, _, restart = key.rpartition(".")
    found = doctor.verdict(folder, folder.events(), job_id, int(restart)) if restart.isdigit() else None
    if found is not None and found.rank == rank:
        print(f"run {folder.id}: {found.finding}: {found.headline()}", file=sys.stderr)
