"""`clusterfsdp` command line. Control-plane commands never import torch or transformers.

Exit codes: 0 ok, 1 the job/run failed, 2 bad input (spec errors, unknown run, Slurm refused).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from datetime import datetime
from pathlib import Path

from . import __version__
from .control import spec as specmod

EXIT_BAD_INPUT = 2


class CliError(Exception):
    """A user-facing error: printed as one line, exit 2."""


def _load(args: argparse.Namespace) -> specmod.JobSpec:
    return specmod.load(args.job, args.set or [])


def _add_job(p: argparse.ArgumentParser) -> None:
    p.add_argument("job", help="job.toml")
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="override a key, typed by the schema (repeatable): --set train.lr=3e-4 --set slurm.nodes=4",
    )


def _add_run(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="run id (or unique prefix) or run folder")
    p.add_argument("--run-root", default="./runs", help="where to look for run ids (default ./runs)")


def _find(args: argparse.Namespace):
    from .control import runfolder

    try:
        return runfolder.find_run(args.run, args.run_root)
    except runfolder.RunNotFound as e:
        raise CliError(str(e)) from None


# ---------------------------------------------------------------- commands
def cmd_init(args: argparse.Namespace) -> int:
    path = Path(args.path)
    if path.exists() and not args.force:
        raise CliError(f"{path} exists (use --force to overwrite)")
    path.write_text(specmod.starter_toml())
    print(f"wrote {path}: edit it, then `clusterfsdp validate {path}`")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    lines = specmod.describe_schema(args.key or "")
    if not lines:
        raise CliError(f"no section or key {args.key!r}; sections: {', '.join(specmod.SECTIONS)}")
    print("\n".join(lines))
    return 0


def summary(spec: specmod.JobSpec, executor: str) -> str:
    from .control.presets import PRESETS, llama_param_count

    s, t = spec.slurm, spec.train
    model = spec.model.name_or_path or f"{spec.model.preset} (random init)"
    params = (
        ""
        if spec.model.name_or_path
        else f", ~{llama_param_count({**PRESETS[spec.model.preset], **spec.model.from_config}) / 1e6:.1f}M params"
    )
    gpus = f"{s.gpus_per_node} GPU(s)" if s.gpus_per_node else "CPU"
    lines = [
        f"job        {spec.job.name} -> {spec.job.run_root}/{spec.job.name}/<run id>/",
        f"resources  {s.nodes} node(s) x {spec.tasks_per_node} worker(s) ({gpus}) = {spec.world_size} ranks, "
        f"time {spec.time_minutes} min, partition {s.partition or '(default)'}",
        f"mesh       {' x '.join(map(str, spec.mesh_shape))} "
        f"({'replicate x shard' if len(spec.mesh_shape) == 2 else 'shard'}), sharding {spec.effective_sharding}, "
        f"FSDP{spec.fsdp.version}, {spec.fsdp.mixed_precision}",
        f"model      {model}{params}",
        f"data       {spec.data.source}{' ' + ', '.join(spec.data.paths) if spec.data.paths else ''}, "
        f"seq {spec.data.seq_len}" + (f", {spec.data.format}, {spec.packing} packing" if spec.data.paths else ""),
        f"train      {t.steps} steps x {t.micro_batch_size * t.grad_accum * spec.world_size} samples "
        f"({t.micro_batch_size}/rank x {t.grad_accum} accum), lr {t.lr:g} {t.schedule}",
        f"checkpoint {f'every {spec.checkpoint.every_steps} steps' if spec.checkpoint.every_steps else 'at the end'}"
        f"{' (async)' if spec.checkpoint.async_ else ''}, keep {spec.checkpoint.keep_last}",
        f"runs on    {executor}",
    ]
    return "\n".join(lines + [f"note       {n}" for n in spec.notices()])


def cmd_validate(args: argparse.Namespace) -> int:
    from .control import datasource, slurmcli

    spec = _load(args)
    errors = datasource.check(spec)
    if errors:
        raise specmod.SpecError(errors)
    where = (
        "Slurm (controller answers)" if slurmcli.available() else "this machine (local executor; no reachable Slurm)"
    )
    if not slurmcli.available() and spec.slurm.nodes > 1:
        where += f" -- but slurm.nodes = {spec.slurm.nodes} needs Slurm"
    print(summary(spec, where))
    for line in datasource.prepared_state(spec):
        print(f"prepared   {line}")
    print("ok")
    return 0


def cmd_data_prepare(args: argparse.Namespace) -> int:
    """Tokenize the job's data now (with a progress bar), in a worker process: the CLI itself
    never imports transformers or datasets."""
    import subprocess

    argv = [sys.executable, "-m", "clusterfsdp.worker.dataprep", args.job, "--workers", str(args.workers)]
    for item in args.set or []:
        argv += ["--set", item]
    return subprocess.call(argv)


def cmd_submit(args: argparse.Namespace) -> int:
    from .control import launch

    spec = _load(args)
    if args.dry_run:
        try:
            run, script = launch.dry_run(spec)
        except launch.SubmitError as e:
            raise CliError(str(e)) from None
        print(script)
        print(
            f"# run folder prepared: {run.path}\n# submit by hand with: sbatch {run.path / 'sbatch.sh'}",
            file=sys.stderr,
        )
        return 0
    try:
        sub = launch.submit(spec, args.executor)
    except launch.SubmitError as e:
        raise CliError(str(e)) from None
    print(sub.notice, file=sys.stderr)
    for n in spec.notices():
        print(f"note: {n}", file=sys.stderr)
    print(f"run {sub.run.id}  job {sub.job_id}  folder {sub.run.path}")
    if args.follow:
        return _follow(sub.run, 0)
    return 0


def _follow(run, rank: int) -> int:
    from .control import logs, status

    def done() -> bool:
        return status.run_status(run).state in logs.FINAL

    try:
        for text in logs.follow(run, rank, done):
            sys.stdout.write(text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        print(f"\nstopped following; the run goes on (clusterfsdp cancel {run.id} stops it)", file=sys.stderr)
        return 130
    st = status.run_status(run)
    print(f"run {run.id}: {st.state}{' - ' + st.reason if st.reason else ''}", file=sys.stderr)
    return 0 if st.state == "COMPLETED" else 1


def _age(ts: float | None) -> str:
    if not ts:
        return "-"
    secs = time.time() - ts
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs >= n:
            return f"{int(secs // n)}{unit} ago"
    return f"{int(secs)}s ago"


def cmd_runs(args: argparse.Namespace) -> int:
    from .control import runfolder, status

    found = runfolder.list_runs(args.run_root)
    if not found:
        print(f"no runs under {Path(args.run_root).expanduser()}")
        return 0
    rows, error = status.statuses(found[: args.limit])
    if error:
        print(f"warning: {error}", file=sys.stderr)
    print(f"{'RUN':<22} {'NAME':<16} {'STATE':<11} {'STEP':>11} {'LOSS':>8} {'JOB':<14} CREATED")
    for st in rows:
        step = f"{st.step or 0}/{st.steps or '?'}"
        loss = f"{st.loss:.4f}" if st.loss is not None else "-"
        job = f"{st.executor}:{st.job_id}" if st.job_id else "-"
        created = _age(st.run.state().get("created"))
        print(f"{st.run.id:<22} {st.run.name[:16]:<16} {st.state:<11} {step:>11} {loss:>8} {job:<14} {created}")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from .control import ckptfolder, status

    if not args.run:
        return cmd_runs(args)
    run = _find(args)
    st = status.run_status(run)
    print(f"run        {run.id} ({run.name})\nfolder     {run.path}")
    print(f"state      {st.state}{' - ' + st.reason if st.reason else ''}")
    print(
        f"progress   step {st.step or 0}/{st.steps or '?'}" + (f", loss {st.loss:.4f}" if st.loss is not None else "")
    )
    if st.eval_loss is not None:
        ppl = math.exp(min(st.eval_loss, 700))
        print(f"eval       step {st.eval_step}: eval_loss {st.eval_loss:.4f}, perplexity {ppl:.2f}")
    for a in run.attempts:
        when = datetime.fromtimestamp(a.get("submitted", 0)).strftime("%Y-%m-%d %H:%M:%S")
        print(f"attempt {a['attempt']}  {a['executor']} job {a['job_id']}  {when}  {a.get('reason', '')}")
    for e in run.events():
        if e.get("event") in ("requeued", "failed", "follow_up", "resumed", "stopped"):
            print(
                f"event      {datetime.fromtimestamp(e['time']).strftime('%H:%M:%S')} job {e.get('job_id')} "
                f"{e['event']} {e.get('reason', '') or e.get('checkpoint', '')}".rstrip()
            )
    try:
        cks = ckptfolder.list_checkpoints(run.checkpoints_dir())
    except specmod.SpecError:
        cks = []
    print(f"checkpoints {', '.join(f'step {c.step}' for c in cks) or 'none'}")
    return 0 if st.state not in ("FAILED", "NODE_FAIL", "TIMEOUT", "OUT_OF_MEMORY") else 1


def cmd_logs(args: argparse.Namespace) -> int:
    from .control import logs

    run = _find(args)
    if args.follow:
        return _follow(run, args.rank)
    path = logs.log_file(run, args.rank, args.attempt)
    if path is None:
        raise CliError(
            f"run {run.id}: no log for rank {args.rank} yet (attempts: {', '.join(logs.attempt_keys(run)) or 'none'})"
        )
    print(logs.tail(path, args.lines))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from .control import launch, slurmcli

    run = _find(args)
    try:
        print(launch.cancel(run))
    except (launch.SubmitError, slurmcli.SlurmError) as e:
        raise CliError(str(e)) from None
    return 0


def cmd_resume(args: argparse.Namespace) -> int:
    from .control import ckptfolder, launch

    run = _find(args)
    spec = specmod.load(run.job_toml, args.set or [])
    root = run.checkpoints_dir(spec)
    target = ckptfolder.find(root, args.step)
    if args.step is not None and target is None:
        raise CliError(
            f"run {run.id}: no complete checkpoint at step {args.step} "
            f"(have: {', '.join(str(c.step) for c in ckptfolder.list_checkpoints(root)) or 'none'})"
        )
    if target is not None and args.step is not None:
        ckptfolder.keep_only_up_to(root, target.step)
    specmod.check(spec)
    run.job_toml.write_text(specmod.dumps(spec, redact=True))  # the new attempt runs with the overrides
    executor: launch.Executor = args.executor or ("slurm" if run.executor == "slurm" else "local")
    try:
        sub = launch.submit(
            spec,
            executor,
            run=run,
            reason=f"resume from step {target.step if target else 0}",
            resume_step=target.step if target else None,
        )
    except launch.SubmitError as e:
        raise CliError(str(e)) from None
    origin = f"step {target.step}" if target else "scratch (no checkpoint)"
    print(f"run {run.id}  job {sub.job_id}  resumes from {origin}")
    if args.follow:
        return _follow(run, 0)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from .control import ckptfolder

    run = _find(args)
    spec = run.spec()
    info = ckptfolder.find(run.checkpoints_dir(spec), args.step)
    if info is None:
        raise CliError(
            f"run {run.id}: no complete checkpoint{' at step ' + str(args.step) if args.step is not None else ''}"
        )
    from .worker.export import export_hf

    out = export_hf(spec, info.path, Path(args.to))
    print(f"exported step {info.step} to {out} (load with AutoModelForCausalLM.from_pretrained)")
    return 0


def cmd_devcluster(args: argparse.Namespace) -> int:
    from .control import devcluster

    return devcluster.main([args.action])


def cmd_tui(args: argparse.Namespace) -> int:
    from .tui import main as tui_main

    return tui_main(args)


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="clusterfsdp", description="job.toml -> multi-node FSDP training on Slurm (or locally)."
    )
    p.add_argument("--version", action="version", version=f"clusterfsdp {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser("init", help="write a commented starter job.toml")
    s.add_argument("path", nargs="?", default="job.toml")
    s.add_argument("--force", action="store_true")
    s.set_defaults(fn=cmd_init)

    s = sub.add_parser("schema", help="document every job.toml key (or one section / key)")
    s.add_argument("key", nargs="?", help="e.g. slurm or train.lr")
    s.set_defaults(fn=cmd_schema)

    s = sub.add_parser("validate", help="check a job and print what it will do")
    _add_job(s)
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("data", help="prepare (tokenize) a job's data before it runs")
    data_sub = s.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    s = data_sub.add_parser("prepare", help="tokenize the job's data into its shared cache, once for all jobs")
    _add_job(s)
    s.add_argument("--workers", type=int, default=0, help="tokenizing processes (default: data.prepare_workers)")
    s.set_defaults(fn=cmd_data_prepare)

    s = sub.add_parser("submit", help="queue a job (Slurm, or locally without Slurm) and return")
    _add_job(s)
    s.add_argument("--executor", choices=["auto", "slurm", "local"], default="auto")
    s.add_argument("--dry-run", action="store_true", help="print the sbatch script; submit nothing")
    s.add_argument("-f", "--follow", action="store_true", help="stream rank-0 output until the run ends")
    s.set_defaults(fn=cmd_submit)

    s = sub.add_parser("runs", help="list runs")
    s.add_argument("--run-root", default="./runs")
    s.add_argument("--limit", type=int, default=50)
    s.set_defaults(fn=cmd_runs)

    s = sub.add_parser("status", help="state of one run (or all runs)")
    s.add_argument("run", nargs="?")
    s.add_argument("--run-root", default="./runs")
    s.add_argument("--limit", type=int, default=50)
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("logs", help="show a rank's log")
    _add_run(s)
    s.add_argument("-f", "--follow", action="store_true")
    s.add_argument("--rank", type=int, default=0)
    s.add_argument("--attempt", help="attempt key <job id>.<restart> (default: newest)")
    s.add_argument("-n", "--lines", type=int, default=200)
    s.set_defaults(fn=cmd_logs)

    s = sub.add_parser("cancel", help="cancel a run's live attempt (workers save first)")
    _add_run(s)
    s.set_defaults(fn=cmd_cancel)

    s = sub.add_parser("resume", help="submit a new attempt of a run from its newest (or a chosen) checkpoint")
    _add_run(s)
    s.add_argument("--step", type=int, help="resume from this checkpoint step (newer ones are set aside)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="override keys, e.g. slurm.nodes=1")
    s.add_argument("--executor", choices=["auto", "slurm", "local"])
    s.add_argument("-f", "--follow", action="store_true")
    s.set_defaults(fn=cmd_resume)

    s = sub.add_parser("export", help="write a checkpoint as a HuggingFace model folder")
    _add_run(s)
    s.add_argument("--step", type=int)
    s.add_argument("--to", required=True, help="output folder")
    s.set_defaults(fn=cmd_export)

    s = sub.add_parser("devcluster", help="a real multi-node Slurm on this machine (root)")
    s.add_argument("action", choices=["up", "down", "status"])
    s.set_defaults(fn=cmd_devcluster)

    s = sub.add_parser("tui", help="the terminal UI")
    s.add_argument("--run-root", default="./runs")
    s.add_argument("--serve", action="store_true", help="serve it to a browser on localhost")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument(
        "--refresh",
        type=float,
        metavar="SECONDS",
        help="seconds between queue refreshes (default: $CLUSTERFSDP_TUI_REFRESH_S or 10)",
    )
    s.set_defaults(fn=cmd_tui)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except specmod.SpecError as e:
        for line in e.errors:
            print(f"error: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
