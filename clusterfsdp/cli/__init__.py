"""`clusterfsdp` command line: a thin front-end over the run service (`control.run.Run`).
Never imports torch or transformers (tests/test_layout.py); work that needs them (export)
runs in a worker subprocess.

Exit codes: 0 ok, 1 the job/run failed, 2 bad input (spec errors, unknown run, Slurm refused,
a run that is busy).

This module is what every call loads: the one parser that `--help` and shell completion read,
`main`, and the few lookups the commands share. `main` loads `dispatch` (what runs a parsed
command) by name once the command line has parsed, and `dispatch` loads the command's group
module by name: a module per group of commands that need the same imports, each importing
them at module level, so each command pays for its own group only:

- `jobcmds`: init, schema (the job file's keys); `validatecmd`: validate (a job file, checked)
- `datacmds`: data prepare / show / status
- `runcmds`: submit, resume, cancel, rm, export, bench (the run service's verbs)
- `statuscmds`: runs, status (run folders and Slurm's job table read, no submit machinery)
- `diagcmds`: doctor, logs (and following a rank's log, which submit -f and resume -f share)
- `folders`: run folders found and listed; `runs --quiet` (completion: nothing of the control plane)
- `sweepview`: status, doctor, export given a sweep, a sweep's line in `runs`, `sweep --follow`
- `sweepcmds`: sweep, and cancel/resume/bench given a sweep (the sweep service)
- `clustercmds`: nodes, devcluster, tui; `completion`: the bash/zsh scripts

A command is registered in `build_parser` by the name of its function, `"<group>.<cmd_fn>"`,
with `sweep_fn` where its reference may name a sweep and `quiet_fn` for `--quiet` (run ids
only); `dispatch.command_name` picks one. `--help` imports no group and nothing of the control
plane (tests/test_cli.py counts the modules each command imports; bench/startup_bench.py
times them).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from pathlib import Path
from typing import Any

from .. import __version__
from ..core.errors import UserError

EXIT_BAD_INPUT = 2


class CliError(UserError):
    """A user-facing error: printed as one line, exit 2."""


# ---------------------------------------------------------------- what the command groups share
def lookup_root(args: argparse.Namespace) -> Path | None:
    """--run-root, or None: look a run up under runroot.lookup_roots() (the default run root and
    those the job files in the current folder set, where their submit put their runs)."""
    return Path(args.run_root).expanduser() if args.run_root else None


def names_sweep(args: argparse.Namespace) -> bool:
    """The command's reference names a sweep (ids start with 'sw'; runs' with a digit)."""
    return args.run.startswith("sw") or (Path(args.run).expanduser() / "sweep.json").is_file()


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
    s.set_defaults(fn="jobcmds.cmd_init")

    s = command("schema", help="document every job.toml key (or one section / key)")
    s.add_argument("key", nargs="?", help="a section or section.key, e.g. slurm or train.lr")
    s.set_defaults(fn="jobcmds.cmd_schema")

    s = command("validate", help="check a job and print what it will do")
    _add_job(s)
    s.add_argument(
        "--executor",
        choices=["auto", "slurm", "local"],
        default="auto",
        help="as for submit; local: for this machine, without asking Slurm (auto asks the controller)",
    )
    s.set_defaults(fn="validatecmd.cmd_validate")

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
    s.set_defaults(fn="datacmds.cmd_data_prepare")
    s = data_sub.add_parser("show", help="samples of the prepared data, the tokens trained on marked")
    _add_job(s)
    s.add_argument("--source", type=int, metavar="I", help="a mixture's data.sources[I] only, in its own order")
    s.add_argument("-n", type=int, default=4, metavar="N", help="how many samples (default 4)")
    s.add_argument("--split", choices=["train", "eval"], default="train", help="train (default) or eval samples")
    s.set_defaults(fn="datacmds.cmd_data_show")
    s = data_sub.add_parser("status", help="how far the job's data is prepared (and its prepare array)")
    _add_job(s)
    s.set_defaults(fn="datacmds.cmd_data_status")

    s = command("nodes", help="nodes runs found faulty, left out of later submits; `nodes clear NODE` ends it")
    s.add_argument("action", nargs="?", choices=["list", "clear"], default="list", help="list (default) or clear")
    s.add_argument("nodes", nargs="*", help="clear: the nodes whose quarantine ends")
    s.add_argument("--cluster", default="", help="the cluster's record (default: Slurm's ClusterName)")
    s.add_argument("--hours", type=float, help="list what was marked this recently (default: slurm.quarantine_hours)")
    s.add_argument("--json", action="store_true", help="the record as JSON: quarantined nodes and every line")
    _add_run_root(s)
    s.set_defaults(fn="clustercmds.cmd_nodes")

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
    s.set_defaults(fn="runcmds.cmd_submit")

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
    s.set_defaults(fn="sweepcmds.cmd_sweep")

    s = command("runs", help="list runs")
    _add_run_root(s)
    s.add_argument("--limit", type=int, default=50, help="show at most this many, newest first (default 50)")
    s.add_argument("--json", action="store_true", help="print the runs as JSON (docs/json.md)")
    s.add_argument("-q", "--quiet", action="store_true", help="print only run ids, newest first (no Slurm query)")
    s.add_argument("--user", nargs="?", const="", metavar="NAME", help="only the runs a user owns (alone: yours)")
    s.set_defaults(fn="statuscmds.cmd_runs", quiet_fn="folders.cmd_run_ids")

    s = command("status", help="state of one run or sweep (or all runs)")
    s.add_argument("run", nargs="?", help="run or sweep id (or unique prefix), or its folder; none: list runs")
    s.add_argument(
        "--sort",
        metavar="KEY",
        help="a sweep's points by loss, eval_loss, step, state, a varied key, bench/TASK/METRIC",
    )
    _add_run_root(s)
    s.add_argument("--limit", type=int, default=50, help="without RUN: show at most this many runs")
    s.add_argument("--json", action="store_true", help="print the status as JSON (docs/json.md)")
    s.add_argument("-q", "--quiet", action="store_true", help="without RUN: print only run ids")
    s.add_argument("--user", nargs="?", const="", metavar="NAME", help="without RUN: only the runs a user owns")
    s.set_defaults(fn="statuscmds.cmd_status", quiet_fn="folders.cmd_run_ids", sweep_fn="sweepview.cmd_status")

    s = command("logs", help="show a rank's log")
    _add_run(s)
    s.add_argument("-f", "--follow", action="store_true", help="follow across requeues until the run ends")
    s.add_argument("--rank", type=int, default=0, help="which rank's log (default 0)")
    s.add_argument("--attempt", help="attempt key <job id>.<restart> (default: newest)")
    s.add_argument("-n", "--lines", type=int, default=200, help="how many lines from the end (default 200)")
    s.set_defaults(fn="diagcmds.cmd_logs")

    s = command("doctor", help="why a run failed: the first error across ranks, its cause, what to do")
    _add_run(s)
    s.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    s.set_defaults(fn="diagcmds.cmd_doctor", sweep_fn="sweepview.cmd_doctor")

    s = command("cancel", help="cancel a run's (or every point of a sweep's) live attempt (workers save first)")
    _add_run(s)
    s.set_defaults(fn="runcmds.cmd_cancel", sweep_fn="sweepcmds.cmd_cancel")

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
    s.set_defaults(fn="runcmds.cmd_resume", sweep_fn="sweepcmds.cmd_resume")

    s = command("export", help="write a checkpoint as a HuggingFace model folder (weights, tokenizer)")
    _add_run(s)
    s.add_argument("--step", type=int, help="the checkpoint step (default: newest)")
    s.add_argument("--best", action="store_true", help="the best checkpoint by checkpoint.keep_best")
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
    s.set_defaults(fn="runcmds.cmd_export", sweep_fn="sweepview.cmd_export")

    s = command("bench", help="run the job's [benchmarks] (lm-eval) on a checkpoint (a sweep: each point's)")
    _add_run(s)
    s.add_argument("--step", type=int, help="the checkpoint step (default: newest)")
    s.add_argument("--all", action="store_true", help="every complete checkpoint that has no result yet")
    s.add_argument(
        "--if-missing", action="store_true", help="leave a step that has a result (the run's own evaluations use it)"
    )
    s.set_defaults(fn="runcmds.cmd_bench", sweep_fn="sweepcmds.cmd_bench")

    s = command("rm", help="remove runs: their folders and checkpoints (never a live run)")
    s.add_argument("run", nargs="*", help="run ids (or unique prefixes) or run folders")
    _add_run_root(s)
    s.add_argument(
        "--prepared", action="store_true", help="also every run never submitted (submit --dry-run leaves one)"
    )
    s.set_defaults(fn="runcmds.cmd_rm")

    s = command("completion", help='print a shell completion script: eval "$(clusterfsdp completion bash)"')
    s.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    s.set_defaults(fn="completion.cmd_completion")

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
    s.set_defaults(fn="clustercmds.cmd_devcluster")

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
    s.set_defaults(fn="clustercmds.cmd_tui")
    return p if built else build_parser()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    named = argv[0] if argv and not argv[0].startswith("-") else None
    args = build_parser(named).parse_args(argv)  # --help and usage errors end here, before any import
    # what runs a parsed command (cli/dispatch.py) is loaded by name, as the groups are: --help pays none of it
    return importlib.import_module(f"{__name__}.dispatch").run(args)
