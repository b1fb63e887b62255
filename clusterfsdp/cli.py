"""`clusterfsdp` command line: a thin front-end over the run service (`control.run.Run`).
Never imports torch or transformers (tests/test_layout.py); work that needs them (export)
runs in a worker subprocess.

Exit codes: 0 ok, 1 the job/run failed, 2 bad input (spec errors, unknown run, Slurm refused,
a run that is busy).

Start-up is paid by every call (`--help`, `validate`, `status`, shell completion), so each command
imports what it needs inside its function: `--help` imports nothing of the control plane, and the
read-only commands (`runs`, `status`, `logs`) read the run folder without the run service's
submit machinery (tests/test_cli.py counts the modules each imports; bench/startup_bench.py times them).

Over 500 lines on purpose: one short function per command (about twenty) plus the one parser that
`--help` and shell completion read; each function only parses, calls the library and prints.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import __version__
from .control.errors import UserError

if TYPE_CHECKING:
    from .control import spec as specmod
    from .control.runfolder import RunFolder

EXIT_BAD_INPUT = 2


class CliError(UserError):
    """A user-facing error: printed as one line, exit 2."""


def _load(args: argparse.Namespace) -> specmod.JobSpec:
    from .control import spec as specmod

    return specmod.load(args.job, args.set or [])


def _run_root(args: argparse.Namespace) -> Path:
    from .control.runroot import default_run_root

    return Path(args.run_root).expanduser() if args.run_root else default_run_root()


def _lookup_root(args: argparse.Namespace) -> Path | None:
    """--run-root, or None: look a run up under runroot.lookup_roots() (the default run root and
    those the job files in the current folder set, where their submit put their runs)."""
    return Path(args.run_root).expanduser() if args.run_root else None


def _find(args: argparse.Namespace):
    from .control.run import Run

    return Run.find(args.run, _lookup_root(args))


def _find_folder(args: argparse.Namespace) -> RunFolder:
    """The run folder, for the commands that only read it (status, logs)."""
    from .control import runfolder

    try:
        return runfolder.find_run(args.run, _lookup_root(args))
    except runfolder.RunNotFound as e:
        raise CliError(str(e)) from None


# ---------------------------------------------------------------- commands
def cmd_init(args: argparse.Namespace) -> int:
    from .control import spec as specmod

    path = Path(args.path)
    if path.exists() and not args.force:
        raise CliError(f"{path} exists (use --force to overwrite)")
    path.write_text(specmod.starter_toml())
    print(f"wrote {path}: edit it, then `clusterfsdp validate {path}`")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from .control import spec as specmod

    print("\n".join(specmod.describe_schema(args.key or "")))  # an unknown key: SpecError, exit 2
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from .control.slurmping import Ping

    # Asks Slurm while the job is checked (start-up); --executor local asks nothing: a job checked
    # for this machine never waits on a controller that is busy, hung or restarting.
    with Ping(ask=args.executor != "local") as ping:
        from .control import inputs
        from .control import spec as specmod
        from .control.summary import summary

        job = specmod.JobText.read(args.job)
        spec = job.load(args.set or [])
        points = 0
        if "sweep" in job.text:  # sweepcli only for a job file that may have a [sweep] table (start-up)
            from . import sweepcli

            points = sweepcli.table_points(job, args.set or [])
        prepared = inputs.prepare_sources(spec, mode="check")  # hub ids: asks the hub, downloads nothing
        spec = prepared.spec
        inside = inputs.container_only_paths(spec)
        later = "checked inside the container when the job starts"
        prepared.notes += [f"data path {path} is not on this host: {later}" for path in inside]
        reachable = ping.state() == "up"
    if args.executor == "local":
        where = "this machine (local executor)"
    else:
        where = "Slurm (controller answers)" if reachable else "this machine (local executor; no reachable Slurm)"
    if not reachable and spec.node_range.high > 1:
        where += f" -- but slurm.nodes = {spec.slurm.nodes} needs Slurm"
    print(summary(spec, where))
    if points:
        print(f"sweep      {points} point(s) in [sweep], each checked: `clusterfsdp sweep {args.job}` runs them")
    for note in prepared.notes:
        print(f"note       {note}")
    for line in [] if inside else inputs.prepared_state(spec):
        print(f"prepared   {line}")
    print("ok")
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """Tokenize the job's data now (with a progress bar), in a worker process: the CLI itself
    never imports transformers or datasets."""
    import subprocess

    if args.executor == "slurm":
        return _data_prepare_array(args)
    argv = [sys.executable, "-m", "clusterfsdp.data.prepare", args.job, "--workers", str(args.workers)]
    for item in args.set or []:
        argv += ["--set", item]
    return subprocess.call(argv)


def _data_prepare_array(args: argparse.Namespace) -> int:
    """`data prepare --executor slurm`: one Slurm job array tokenizes the missing datasets
    (control/prepjob.py); with --follow, its progress until it ends."""
    from .control import launch, prepjob
    from .control import spec as specmod
    from .control.spec.allowlists import sbatch_name_error
    from .data.checks import source_problems

    spec = _load(args)
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
    process like `data prepare`: the CLI never imports numpy or the tokenizer."""
    import subprocess

    argv = [sys.executable, "-m", "clusterfsdp.data.show", args.job, "-n", str(args.n), "--split", args.split]
    argv += ["--source", str(args.source)] if args.source is not None else []
    for item in args.set or []:
        argv += ["--set", item]
    return subprocess.call(argv)


def cmd_data_status(args: argparse.Namespace) -> int:
    from .control import prepjob

    for line in prepjob.status_lines(_load(args)):
        print(line)
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from .control.run import Run
    from .control.sweepplan import has_table

    spec = _load(args)
    if has_table(Path(args.job)):
        raise CliError(f"{args.job} has a [sweep] table: `clusterfsdp sweep {args.job}` runs its points")
    if args.dry_run:
        if args.parsable:
            raise CliError("--parsable prints a job id, and a dry run queues no job (use --json)")
        run, script = Run.dry_run(spec)
        print(_json(run.status()) if args.json else script)
        print(
            f"# run folder prepared: {run.path}\n# submit by hand with: sbatch {run.folder.sbatch_script}",
            file=sys.stderr,
        )
        if _slurm_answers():
            from .control import pending

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
        return _follow(sub.run, 0, sub.job_id)
    return 0


def _slurm_answers() -> bool:
    from .control import slurmping

    return slurmping.controller() == "up"


def _json(value) -> str:
    from .control import jsonout

    return jsonout.document(value)


def _print_submission(sub, args: argparse.Namespace, line: str) -> None:
    """The queued attempt on stdout: a line for people, `--json`, or `--parsable` (the job id
    alone, as `sbatch --parsable` prints it, for JOB=$(clusterfsdp submit --parsable ...))."""
    if args.parsable:
        print(sub.job_id, flush=True)
    elif args.json:
        print(_json(sub), flush=True)
    else:
        print(line, flush=True)


def _log_output(path: Path):
    """Where a log's own bytes go: as they are (as `cat` shows them: progress bars, colours) when only
    you could have written the file; escaped like every other line (`term.SafeStream`) when another
    user could have (a run of theirs in a shared run root: escape sequences in it would drive your
    terminal)."""
    from . import term
    from .control import ownership

    return term.raw(sys.stdout) if ownership.path_clause(path) is None else sys.stdout


def _follow(run, rank: int, job_id: str | None = None) -> int:
    """Stream a rank's log until the run ends (from attempt `job_id` on, if given)."""
    from .control import logs

    def done() -> bool:
        return run.status().state.final

    own = _log_output(run.folder.path / "logs")
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


def cmd_sweep(args: argparse.Namespace) -> int:
    from . import sweepcli

    return sweepcli.cmd_sweep(args)


def _names_sweep(args: argparse.Namespace) -> bool:
    """The command's reference names a sweep (ids start with 'sw'; runs' with a digit)."""
    return args.run.startswith("sw") or (Path(args.run).expanduser() / "sweep.json").is_file()


def cmd_runs(args: argparse.Namespace) -> int:
    from .control import runfolder
    from .control.runroot import lookup_roots

    roots = [_run_root(args)] if args.run_root else lookup_roots()
    found = sorted({r for root in roots for r in runfolder.iter_runs(root)}, key=lambda r: r.id, reverse=True)
    if args.user is not None:  # the runs whose folders a user owns (`--user` alone: yours)
        from .control.ownership import user_name
        from .control.status import owner

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
    from . import term
    from .control import cost, status

    if swept:  # a sweep is one line (`status SWEEP` lists its points); ONE squeue and sacct for all
        from . import sweepcli
        from .control.sweepfolder import SweepFolder

        lines, every, error = sweepcli.sweep_lines([SweepFolder(p) for p in swept], plain)
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
        from .control import jsonout

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
    if _names_sweep(args):
        from . import sweepcli

        return sweepcli.cmd_status(args, _lookup_root(args))
    from datetime import datetime

    from . import term
    from .control import records, samplestats, status
    from .control.records import EventKind, RunState

    folder = _find_folder(args)
    st = status.run_status(folder)
    status.with_costs([st])
    if args.json:
        print(_json(st))
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
        from .control.numbers import perplexity

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
        from .control import doctor

        found = doctor.diagnose(folder, st.events, st.state.live, st.state, st.reason)
        if st.state.bad or found.finding is doctor.Finding.HANG:
            print("\n".join(found.render(short=True)))
    return 1 if st.state.bad else 0


def _benchmark_lines(folder: RunFolder) -> None:
    """The newest benchmark scores (stderr columns left out) and how many evaluations failed."""
    from .control import benchresults

    for row in benchresults.rows(folder)[-1:]:
        scores = ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k.startswith("bench/") and "_stderr" not in k)
        print(f"benchmark  step {row['step']}: {scores}")
    if failed := benchresults.failures(folder):
        print(f"benchmark  {len(failed)} evaluation(s) failed (`clusterfsdp doctor {folder.id}`)")


def _why_waiting(folder: RunFolder, job_id: str) -> None:
    """A pending Slurm job: when the scheduler expects it to start, and what would start it
    sooner (fewer nodes or another partition free now; a shorter time limit, as Slurm's test of
    the job's own batch script says)."""
    from .control import pending

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
    if _names_sweep(args):
        from . import sweepcli

        return sweepcli.cmd_doctor(args, _run_root(args))

    from .control import benchresults, doctor, status, strictjson

    folder = _find_folder(args)
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
    from .control import logs

    folder = _find_folder(args)
    if args.follow:
        from .control.run import Run

        return _follow(Run(folder), args.rank)
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
    print(text, file=_log_output(path))  # the log's own bytes, as `cat` shows them (if yours)
    return 0


def _say_why_the_rank_ended(folder: RunFolder, key: str, rank: int) -> None:
    """The doctor's verdict on the incarnation `key` when it names this rank (a rank killed
    before it wrote anything), on stderr."""
    from .control import doctor

    job_id, _, restart = key.rpartition(".")
    found = doctor.verdict(folder, folder.events(), job_id, int(restart)) if restart.isdigit() else None
    if found is not None and found.rank == rank:
        print(f"run {folder.id}: {found.finding}: {found.headline()}", file=sys.stderr)


def cmd_cancel(args: argparse.Namespace) -> int:
    if _names_sweep(args):
        from . import sweepcli

        return sweepcli.cmd_cancel(args, _lookup_root(args))
    print(_find(args).cancel())
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    if _names_sweep(args):
        from . import sweepcli

        return sweepcli.cmd_resume(args, _lookup_root(args))
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
        return _follow(run, 0, sub.job_id)
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    """Remove runs (Run.remove refuses live runs and other users' runs); exit 2 if any was refused."""
    from .control.run import Run, RunError

    root = _run_root(args)
    runs = [Run.find(ref, _lookup_root(args)) for ref in args.run]
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
    if _names_sweep(args):
        from . import sweepcli

        return sweepcli.cmd_export(args, _run_root(args))
    if args.best and args.step is not None:
        raise CliError("export: give --step or --best, not both")
    return _find(args).export(Path(args.to), args.step, args.dtype, args.force, best=args.best, merge=args.merge)


def cmd_bench(args: argparse.Namespace) -> int:
    """lm-eval on checkpoints of a run (control/bench.py): each result printed as it lands."""
    from .control import bench

    if args.all and args.step is not None:
        raise CliError("bench: give --step or --all, not both")
    run = _find(args)
    steps = bench.steps_to_run(run, args.step, args.all)
    if not steps:
        print(f"run {run.id}: every checkpoint has its benchmarks already (--step N evaluates one again)")
    for step in steps:
        print(bench.describe(bench.evaluate(run, step)), flush=True)
    return 0


def cmd_nodes(args: argparse.Namespace) -> int:
    from .control import nodescli

    return nodescli.main(args, _run_root(args))


def cmd_completion(args: argparse.Namespace) -> int:
    from . import completion

    parser = build_parser()
    print(completion.bash_script(parser) if args.shell == "bash" else completion.zsh_script(parser))
    return 0


def cmd_devcluster(args: argparse.Namespace) -> int:
    from .control import devcluster

    argv = [args.action]
    if args.nodes is not None:
        argv += ["--nodes", str(args.nodes)]
    if args.state is not None:
        argv += ["--state", str(args.state)]
    if args.prefix is not None:
        argv += ["--prefix", args.prefix]
    return devcluster.main(argv)


def cmd_tui(args: argparse.Namespace) -> int:
    from .tui import main as tui_main

    args.run_root = str(_run_root(args))
    return tui_main(args)


# ---------------------------------------------------------------- parser
def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, found {text!r}")
    return int(text)


def _add_job(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="the job file (job.toml)")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a key, typed by the schema (repeatable): --set train.lr=3e-4 --set slurm.nodes=4",
    )


def _add_run_root(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--run-root",
        metavar="DIR",
        help="where to look for runs (default: $CLUSTERFSDP_RUN_ROOT, else run_root in "
        "~/.config/clusterfsdp/config.toml, else ./runs)",
    )


def _add_output(p: argparse.ArgumentParser) -> None:
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the queued attempt as JSON (docs/json.md)")
    out.add_argument("--parsable", action="store_true", help="print only the job id (like sbatch --parsable)")


def _add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id (or a unique prefix of one) or run folder")
    _add_run_root(p)


class _Unbuilt:
    """Stands in for the parser of a command this call does not run: every call builds only the
    parser of the command it names (`build_parser(only)`), since argparse's work for the other
    twenty (a gettext lookup per help string) is a start-up cost of every call."""

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self


@functools.cache  # built once per process (the fuzz test calls main() thousands of times)
def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command-line parser: every command (for --help, completion and an unknown command), or
    only the command `only` when that names one."""
    p = argparse.ArgumentParser(
        prog="clusterfsdp", description="job.toml -> multi-node FSDP training on Slurm (or locally)."
    )
    p.add_argument("--version", action="version", version=f"clusterfsdp {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    built: list[str] = []

    def command(name: str, help: str) -> Any:
        if only not in (None, name):
            return _Unbuilt()
        built.append(name)
        return sub.add_parser(name, help=help)

    s = command("init", help="write a commented starter job.toml")
    s.add_argument("path", nargs="?", default="job.toml", help="file to write (default job.toml)")
    s.add_argument("--force", action="store_true", help="overwrite an existing file")
    s.set_defaults(fn=cmd_init)

    s = command("schema", help="document every job.toml key (or one section / key)")
    s.add_argument("key", nargs="?", help="a section or section.key, e.g. slurm or train.lr")
    s.set_defaults(fn=cmd_schema)

    s = command("validate", help="check a job and print what it will do")
    _add_job(s)
    s.add_argument(
        "--executor",
        choices=["auto", "slurm", "local"],
        default="auto",
        help="as for submit; local: for this machine, without asking Slurm (auto asks the controller)",
    )
    s.set_defaults(fn=cmd_validate)

    s = command("data", help="prepare (tokenize) a job's data before it runs")
    data_sub = s.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    s = data_sub.add_parser("prepare", help="tokenize the job's data into its shared cache, once for all jobs")
    _add_job(s)
    s.add_argument("--workers", type=int, default=0, help="tokenizing processes (default: data.prepare_workers)")
    s.add_argument(
        "--executor", choices=["local", "slurm"], default="local", help="local (default): here; slurm: a job array"
    )
    size = s.add_mutually_exclusive_group()
    size.add_argument("--nodes", type=_positive, help="slurm: one task per node, each with the whole node")
    size.add_argument("--array-size", type=_positive, help="slurm: this many tasks of --cpus-per-task CPUs")
    s.add_argument("--partition", help="slurm: partition (default: data.prepare_partition, else slurm.partition)")
    s.add_argument("--cpus-per-task", type=_positive, help="slurm: CPUs of each task (a process per CPU)")
    s.add_argument("--time", help="slurm: time limit of each task (default: slurm.time)")
    s.add_argument("-f", "--follow", action="store_true", help="slurm: show the progress until the array ends")
    s.set_defaults(fn=cmd_data_prepare)
    s = data_sub.add_parser("show", help="samples of the prepared data, the tokens trained on marked")
    _add_job(s)
    s.add_argument("--source", type=int, metavar="I", help="a mixture's data.sources[I] only, in its own order")
    s.add_argument("-n", type=int, default=4, metavar="N", help="how many samples (default 4)")
    s.add_argument("--split", choices=["train", "eval"], default="train", help="train (default) or eval samples")
    s.set_defaults(fn=cmd_data_show)
    s = data_sub.add_parser("status", help="how far the job's data is prepared (and its prepare array)")
    _add_job(s)
    s.set_defaults(fn=cmd_data_status)

    s = command("nodes", help="nodes runs found faulty, left out of later submits; `nodes clear NODE` ends it")
    s.add_argument("action", nargs="?", choices=["list", "clear"], default="list", help="list (default) or clear")
    s.add_argument("nodes", nargs="*", help="clear: the nodes whose quarantine ends")
    s.add_argument("--cluster", default="", help="the cluster's record (default: Slurm's ClusterName)")
    s.add_argument("--hours", type=float, help="list what was marked this recently (default: slurm.quarantine_hours)")
    s.add_argument("--json", action="store_true", help="the record as JSON: quarantined nodes and every line")
    _add_run_root(s)
    s.set_defaults(fn=cmd_nodes)

    s = command("submit", help="queue a job (Slurm, or locally without Slurm) and return")
    _add_job(s)
    s.add_argument(
        "--executor",
        choices=["auto", "slurm", "local"],
        default="auto",
        help="auto (default): Slurm when a controller answers, else this machine",
    )
    s.add_argument(
        "--dry-run", action="store_true", help="prepare the run folder, print the sbatch script; queue nothing"
    )
    s.add_argument("-f", "--follow", action="store_true", help="stream rank-0 output until the run ends")
    _add_output(s)
    s.set_defaults(fn=cmd_submit)

    s = command("sweep", help="queue many runs of a job: a grid of values (one Slurm job array)")
    _add_job(s)
    s.add_argument("--grid", action="append", metavar="KEY=V1,V2", help="vary a key (repeatable: the cross product)")
    s.add_argument("--zip", action="append", metavar="KEY=V1,V2", help="vary keys together (lists of one length)")
    s.add_argument("--max-parallel", type=int, metavar="N", help="points running at once (default: [sweep] or 0)")
    s.add_argument("--executor", choices=["auto", "slurm", "local"], default="auto", help="as for submit")
    s.add_argument("--dry-run", action="store_true", help="check every point and list them; make and queue nothing")
    s.add_argument("--json", action="store_true", help="print the sweep record as JSON")
    s.add_argument(
        "-f",
        "--follow",
        action="store_true",
        help="a line per point as its state changes, until all end (exit 1: one did not complete)",
    )
    s.set_defaults(fn=cmd_sweep)

    s = command("runs", help="list runs")
    _add_run_root(s)
    s.add_argument("--limit", type=int, default=50, help="show at most this many, newest first (default 50)")
    s.add_argument("--json", action="store_true", help="print the runs as JSON (docs/json.md)")
    s.add_argument("-q", "--quiet", action="store_true", help="print only run ids, newest first (no Slurm query)")
    s.add_argument("--user", nargs="?", const="", metavar="NAME", help="only the runs a user owns (alone: yours)")
    s.set_defaults(fn=cmd_runs)

    s = command("status", help="state of one run or sweep (or all runs)")
    s.add_argument("run", nargs="?", help="run or sweep id (or unique prefix), or its folder; none: list runs")
    s.add_argument("--sort", metavar="KEY", help="a sweep's points by eval_loss, loss, step, state or a varied key")
    _add_run_root(s)
    s.add_argument("--limit", type=int, default=50, help="without RUN: show at most this many runs")
    s.add_argument("--json", action="store_true", help="print the status as JSON (docs/json.md)")
    s.add_argument("-q", "--quiet", action="store_true", help="without RUN: print only run ids")
    s.add_argument("--user", nargs="?", const="", metavar="NAME", help="without RUN: only the runs a user owns")
    s.set_defaults(fn=cmd_status)

    s = command("logs", help="show a rank's log")
    _add_run(s)
    s.add_argument("-f", "--follow", action="store_true", help="follow across requeues until the run ends")
    s.add_argument("--rank", type=int, default=0, help="which rank's log (default 0)")
    s.add_argument("--attempt", help="attempt key <job id>.<restart> (default: newest)")
    s.add_argument("-n", "--lines", type=int, default=200, help="how many lines from the end (default 200)")
    s.set_defaults(fn=cmd_logs)

    s = command("doctor", help="why a run failed: the first error across ranks, its cause, what to do")
    _add_run(s)
    s.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    s.set_defaults(fn=cmd_doctor)

    s = command("cancel", help="cancel a run's (or every point of a sweep's) live attempt (workers save first)")
    _add_run(s)
    s.set_defaults(fn=cmd_cancel)

    s = command("resume", help="submit a new attempt of a run from its newest (or a chosen) checkpoint")
    _add_run(s)
    s.add_argument("--step", type=int, help="resume from this checkpoint step (newer ones are set aside)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="override keys, e.g. slurm.nodes=1")
    s.add_argument("--executor", choices=["auto", "slurm", "local"], help="default: the run's executor")
    s.add_argument(
        "--force", action="store_true", help="cancel a live attempt first, wait for its checkpoint, then resume"
    )
    s.add_argument(
        "--without-secrets",
        action="store_true",
        help="go on although redacted [env] secrets are not in this environment",
    )
    s.add_argument("-f", "--follow", action="store_true", help="stream rank-0 output until the run ends")
    _add_output(s)
    s.set_defaults(fn=cmd_resume)

    s = command("export", help="write a checkpoint as a HuggingFace model folder (weights, tokenizer)")
    _add_run(s)
    s.add_argument("--step", type=int, help="the checkpoint step (default: newest)")
    s.add_argument("--best", action="store_true", help="the lowest-eval-loss checkpoint (checkpoint.keep_best)")
    s.add_argument("--to", required=True, help="output folder (created; a non-empty one only with --force)")
    s.add_argument(
        "--dtype",
        choices=["float32", "bfloat16", "float16"],
        help="weights dtype (default: model.dtype; LoRA --merge: peft.base_dtype when set)",
    )
    s.add_argument("--force", action="store_true", help="replace a non-empty --to folder")
    s.add_argument(
        "--merge", action="store_true", help="LoRA runs: a full model with the adapters merged (default: the adapters)"
    )
    s.set_defaults(fn=cmd_export)

    s = command("bench", help="run the job's [benchmarks] (lm-eval) on a checkpoint: benchmarks/step-N.json")
    _add_run(s)
    s.add_argument("--step", type=int, help="the checkpoint step (default: newest)")
    s.add_argument("--all", action="store_true", help="every complete checkpoint that has no result yet")
    s.set_defaults(fn=cmd_bench)

    s = command("rm", help="remove runs: their folders and checkpoints (never a live run)")
    s.add_argument("run", nargs="*", help="run ids (or unique prefixes) or run folders")
    _add_run_root(s)
    s.add_argument(
        "--prepared", action="store_true", help="also every run never submitted (submit --dry-run leaves one)"
    )
    s.set_defaults(fn=cmd_rm)

    s = command("completion", help='print a shell completion script: eval "$(clusterfsdp completion bash)"')
    s.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    s.set_defaults(fn=cmd_completion)

    s = command("devcluster", help="a real multi-node Slurm on this machine (root)")
    s.add_argument(
        "action", choices=["up", "down", "status", "restart"], help="start, stop, show or rebuild the cluster"
    )
    s.add_argument("--nodes", type=int, default=None, help="compute nodes for `up` (default 2)")
    s.add_argument("--state", default=None, help="state folder (default /tmp/clusterfsdp-devcluster[-PREFIX])")
    s.add_argument(
        "--prefix",
        default=None,
        help="a second cluster beside the default one: 1-4 of a-z0-9 (its own namespaces, bridge, subnet, state, lock)",
    )
    s.set_defaults(fn=cmd_devcluster)

    s = command("tui", help="the terminal UI")
    _add_run_root(s)
    s.add_argument(
        "--serve",
        action="store_true",
        help="serve it to a browser on 127.0.0.1, behind a token (printed; or $CLUSTERFSDP_TUI_TOKEN)",
    )
    s.add_argument("--port", type=int, default=8000, help="port for --serve (default 8000)")
    s.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="URL",
        help="with --serve: also accept this origin, e.g. https://tui.example.org behind a reverse proxy",
    )
    s.add_argument(
        "--refresh",
        type=float,
        metavar="SECONDS",
        help="seconds between queue refreshes (default: $CLUSTERFSDP_TUI_REFRESH_S or 10)",
    )
    s.set_defaults(fn=cmd_tui)
    return p if built else build_parser()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = argv[0] if argv and not argv[0].startswith("-") else None
    args = build_parser(named).parse_args(argv)  # --help and usage errors end here, before any import
    from . import term

    with term.safe_output():  # names and reasons read from run folders never drive the terminal
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from . import term

    try:
        if args.command in ("init", "schema", "completion") or getattr(args, "quiet", False):
            return args.fn(args)
        from .control import retrynotes

        with retrynotes.retry_notices(retrynotes.say_on_stderr):  # a controller outage is waited for, visibly
            return args.fn(args)
    except UserError as e:  # every front-end catches this one base (control.errors)
        for line in e.lines:
            print(f"{term.style('error:', 'red', sys.stderr)} {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `clusterfsdp runs | head`: the reader left; say nothing more
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
