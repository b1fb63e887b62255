"""Run a job.toml from a Jupyter notebook: `srun` into the allocation the kernel sits in, or
local processes on a machine without Slurm, with live output, a progress display, a working
stop button and the result back as Python data.

    from clusterfsdp.notebook import srun
    result = srun("jobs/tiny-cpu.toml", nodes=2)       # inside `salloc -N2 ...`
    result.final_metrics, result.checkpoint, result.exit_codes

Where it runs (`launcher="auto"`):

* `SLURM_JOB_ID` is set and `srun` is on PATH: one job step in that allocation, one task per
  GPU (or `slurm.tasks_per_node`), every resource restated on the srun line and the inherited
  `SLURM_*` variables that would conflict with them scrubbed.
* no allocation, but a Slurm controller answers: an error saying to `salloc` first or to use
  `clusterfsdp.submit(...)` (a batch job).
* no allocation and no reachable Slurm: local processes on this machine (torchrun-style env),
  with the same streaming and interrupt behaviour.

The launcher (srun, or the local supervisor below) runs in its own session, so the SIGINT that
Jupyter's stop button sends to the kernel's process group never reaches it uncontrolled; on
KeyboardInterrupt the step is cancelled explicitly (SIGTERM: the ranks save a checkpoint at the
next step boundary; SIGKILL after `grace_s`), and this waits until every rank is gone.

The run folder is a normal one (`runfolder.create_run`): `clusterfsdp status/logs` and the TUI see it.
Each rank runs `python -m clusterfsdp.notebook _task RUN_DIR`, a thin wrapper over
`clusterfsdp.worker.run` that reports its host and exit status on stdout.

Importing this module is cheap: no torch, no IPython (both are imported where needed).
"""

from __future__ import annotations

import dataclasses
import html
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, cast

from ..control import ckptfolder, runfolder, slurmcli
from ..control import spec as specmod
from ..worker.main import ENV_LOG_ALL_RANKS

MARK = "@@clusterfsdp "  # marker lines the tasks print on stdout (never shown in the cell)

# Inherited variables kept for the srun line: only what names the allocation and finds the cluster.
_KEEP_SLURM = {"SLURM_JOB_ID", "SLURM_JOBID", "SLURM_CONF", "SLURM_CLUSTERS", "SLURM_TIME_FORMAT"}
# Everything else with these prefixes would restate (and conflict with) the step's resources:
# SLURM_NTASKS, SLURM_CPUS_PER_TASK, SLURM_MEM_PER_*, SLURM_TRES_PER_TASK, SLURM_GPUS*, SLURM_DISTRIBUTION,
# SLURM_STEP_* of a kernel that is itself a step (Open OnDemand), SRUN_*/SALLOC_*/SBATCH_* input variables.
_DROP_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SALLOC_", "SBATCH_", "SUBMITIT_", "PMI_", "PMIX_", "OMPI_")
# torchrun-style variables of the kernel itself must not leak into the ranks.
_DROP_NAMES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CLUSTERFSDP_JOB_ID",
    "CLUSTERFSDP_RESTART",
    ENV_LOG_ALL_RANKS,
}

_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")
_SRUN_TASK_ERROR = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.*)$")
_last_result: SrunResult | None = None


# ---------------------------------------------------------------- errors
class NotebookError(RuntimeError):
    """A user-facing launch error; IPython shows the message without a traceback."""

    def _render_traceback_(self) -> list[str]:
        return [f"{type(self).__name__}: {line}" if i == 0 else line for i, line in enumerate(str(self).splitlines())]


class NotInAllocation(NotebookError):
    """`srun` was asked for outside a Slurm allocation."""


class SrunError(NotebookError):
    """srun (or the local launcher) could not start the job."""


class StepInterrupted(KeyboardInterrupt):
    """Raised after the stop button (KeyboardInterrupt) cancelled the step; `.result` has what was done.

    A KeyboardInterrupt, so "Run All" stops here as it does for any interrupted cell; IPython
    shows only the message."""

    def __init__(self, message: str, result: SrunResult):
        super().__init__(message)
        self.result = result

    def _render_traceback_(self) -> list[str]:
        return [f"StepInterrupted: {self.args[0]}", "(the result so far: clusterfsdp.notebook.last_result())"]


class StepFailed(NotebookError):
    """Raised with `check=True` when a rank failed; `.result` has the exit status per rank."""

    def __init__(self, message: str, result: SrunResult):
        super().__init__(message)
        self.result = result


# ---------------------------------------------------------------- job spec from a path / TOML text / JobSpec
def _override_list(overrides: Mapping[str, Any] | Iterable[str] | str | None) -> list[str]:
    if overrides is None:
        return []
    if isinstance(overrides, str):
        return [overrides]
    if isinstance(overrides, Mapping):
        return [f"{key}={specmod._inline(value)}" for key, value in overrides.items()]
    return [str(o) for o in overrides]


def load_job(
    job: str | os.PathLike[str] | specmod.JobSpec, overrides: Mapping[str, Any] | Iterable[str] | str | None = None
) -> specmod.JobSpec:
    """A JobSpec from a job.toml path, TOML text or a JobSpec, with `--set`-style overrides
    (a list of 'section.key=value' or a dict {'section.key': value}). Relative paths in TOML text
    or a JobSpec are taken relative to the current directory (the notebook's folder)."""
    ovr = _override_list(overrides)
    if isinstance(job, specmod.JobSpec):
        data = specmod.to_dict(job)
        specmod.apply_overrides(data, ovr)
        return specmod.with_absolute_paths(specmod.from_dict(data), Path.cwd())
    if isinstance(job, os.PathLike):
        return specmod.load(Path(job).expanduser(), ovr)
    if isinstance(job, str):
        is_path = "\n" not in job and ("=" not in job or Path(job).expanduser().is_file())
        if is_path:
            return specmod.load(Path(job).expanduser(), ovr)
        return specmod.with_absolute_paths(specmod.loads(job, ovr), Path.cwd())
    raise TypeError(f"job: expected a path, TOML text or a JobSpec, found {type(job).__name__}")


def with_layout(
    spec: specmod.JobSpec, nodes: int | None = None, gpus_per_node: int | None = None, tasks_per_node: int | None = None
) -> specmod.JobSpec:
    """The spec with the step's layout written into it (the workers build their mesh from it)."""
    s = spec.slurm
    changes: dict[str, int] = {}
    if nodes is not None:
        changes["nodes"] = int(nodes)
    if gpus_per_node is not None:
        changes["gpus_per_node"] = int(gpus_per_node)
        if tasks_per_node is None and gpus_per_node and s.tasks_per_node not in (0, gpus_per_node):
            changes["tasks_per_node"] = 0  # one task per GPU
    if tasks_per_node is not None:
        changes["tasks_per_node"] = int(tasks_per_node)
    if not changes:
        return spec
    out = dataclasses.replace(spec, slurm=dataclasses.replace(s, **changes))
    specmod.check(out)
    return out


# ---------------------------------------------------------------- where it runs
def in_allocation(environ: Mapping[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    return bool(env.get("SLURM_JOB_ID")) and shutil.which("srun", path=env.get("PATH")) is not None


def outside_allocation_message(reason: str) -> str:
    return (
        f"not inside a Slurm allocation: {reason}.\n"
        "Either start the kernel inside an allocation: `salloc -N2 --ntasks-per-node=2 --time=60` (add your "
        "--partition/--gpus-per-node), then start Jupyter or the kernel from that shell (an Open OnDemand "
        "Jupyter session already is one);\n"
        "or queue the job as a batch job instead: `clusterfsdp.submit(job)` (or `%clusterfsdp submit job.toml`)."
    )


def choose_launcher(launcher: str = "auto", environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """('srun' | 'local', a one-line notice saying why). Decided by "is there an allocation
    (SLURM_JOB_ID) and an srun binary", then, outside one, by whether a controller answers."""
    env = os.environ if environ is None else environ
    if launcher not in ("auto", "srun", "local"):
        raise ValueError(f"launcher: expected 'auto', 'srun' or 'local', found {launcher!r}")
    if launcher == "local":
        return "local", "launcher: local processes on this machine (requested)"
    job_id = env.get("SLURM_JOB_ID", "")
    if job_id:
        if shutil.which("srun", path=env.get("PATH")) is None:
            raise SrunError(
                f"SLURM_JOB_ID={job_id} is set but there is no `srun` on PATH: load the Slurm module "
                "in the kernel's environment, or pass launcher='local' to run on this machine"
            )
        nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "?"
        return "srun", f"launcher: srun into allocation {job_id} (nodes {nodes})"
    if launcher == "srun":
        raise NotInAllocation(outside_allocation_message("SLURM_JOB_ID is not set in this kernel"))
    if slurmcli.available():
        raise NotInAllocation(
            outside_allocation_message(
                "SLURM_JOB_ID is not set in this kernel, and a Slurm controller answers, so work must go through it"
            )
        )
    return "local", (
        "launcher: local processes on this machine (no Slurm allocation and no reachable Slurm controller)"
    )


def launcher_env(
    mode: str, spec: specmod.JobSpec, environ: Mapping[str, str] | None = None, *, all_ranks: bool = False
) -> dict[str, str]:
    """The environment of the srun process or the local supervisor. The allocation's resource
    variables are scrubbed because srun would read them as options conflicting with the ones on its
    line (only what names the allocation and finds the cluster is kept, and only for srun); the
    [env] secrets are added here because they must never be written to a file (srun passes them
    on with `--export=ALL`)."""
    keep = _KEEP_SLURM if mode == "srun" else set()
    env = {
        k: v
        for k, v in (os.environ if environ is None else environ).items()
        if k in keep or not (k.startswith(_DROP_PREFIXES) or k in _DROP_NAMES)
    }
    env.update(specmod.secret_env(spec))
    env["PYTHONUNBUFFERED"] = "1"
    if all_ranks:
        env[ENV_LOG_ALL_RANKS] = "1"
    return env


def srun_command(
    spec: specmod.JobSpec, run_dir: str | Path, *, step_name: str, overlap: bool = False, srun_args: Sequence[str] = ()
) -> list[str]:
    """The srun line: every resource of the step stated explicitly, nothing taken from the environment."""
    s = spec.slurm
    cmd = [
        "srun",
        f"--job-name={step_name}",
        f"--nodes={s.nodes}",
        f"--ntasks={spec.world_size}",
        f"--ntasks-per-node={spec.tasks_per_node}",
        "--distribution=block",
        "--kill-on-bad-exit=1",
        "--label",
        "--input=none",
        "--export=ALL",
    ]
    if s.gpus_per_node:
        cmd.append(f"--gpus-per-node={s.gpus_per_node}")
    if s.cpus_per_task:
        cmd.append(f"--cpus-per-task={s.cpus_per_task}")
    if s.mem_gb:
        cmd.append(f"--mem={int(s.mem_gb * 1024)}M")
    if overlap:
        cmd.append("--overlap")
    cmd += list(srun_args)
    return [*cmd, sys.executable, "-u", "-m", "clusterfsdp.notebook", "_task", str(run_dir)]


def allocation_nodes(environ: Mapping[str, str] | None = None) -> int | None:
    env = os.environ if environ is None else environ
    value = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    return int(value) if value and value.isdigit() else None


# ---------------------------------------------------------------- the result
@dataclasses.dataclass
class SrunResult:
    """What a notebook launch did. `metrics` are the metrics.jsonl rows (list of dicts);
    `final_metrics` the last one; `exit_codes` {rank: code} (negative: killed by that signal,
    None: unknown)."""

    run: runfolder.RunFolder
    launcher: str  # srun | local
    job_id: str  # the attempt's job id in the run folder: SLURM_JOB_ID of the allocation, or 'nb<pid>'
    step: str  # srun: the job step '<SLURM_JOB_ID>.<step>' (what scancel and `squeue --steps` name); local: ''
    status: str  # completed | stopped | interrupted | failed
    returncode: int | None
    exit_codes: dict[int, int | None]
    hosts: dict[int, str]
    metrics: list[dict[str, Any]]
    checkpoint: Path | None
    elapsed_s: float
    message: str = ""

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def where(self) -> str:
        return f"srun step {self.step}" if self.step else f"{self.launcher} job {self.job_id}"

    @property
    def final_metrics(self) -> dict[str, Any]:
        return dict(self.metrics[-1]) if self.metrics else {}

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    def metrics_frame(self):
        """The metrics as a pandas DataFrame when pandas is installed, else the list of rows."""
        try:
            import pandas as pd
        except ImportError:
            return list(self.metrics)
        return pd.DataFrame(self.metrics)

    def log(self, rank: int = 0) -> str:
        """This rank's log of this launch."""
        p = self.run.log_path(self.job_id, 0, rank)
        return p.read_text() if p.is_file() else ""

    def summary(self) -> str:
        m = self.final_metrics
        parts = [
            f"run {self.run.id}: {self.status}",
            self.where,
            f"{len(self.exit_codes)} ranks",
            f"{self.elapsed_s:.1f} s",
        ]
        if m:
            parts.append(f"step {m.get('step')} loss {m.get('loss', float('nan')):.4f}")
        lines = [", ".join(parts), f"folder      {self.run.path}"]
        if self.checkpoint:
            lines.append(f"checkpoint  {self.checkpoint}")
        codes = " ".join(f"{r}:{'?' if c is None else c}" for r, c in sorted(self.exit_codes.items()))
        lines.append(f"exit codes  {codes or '-'}" + (f"  (srun {self.returncode})" if self.launcher == "srun" else ""))
        if self.message:
            lines.append(self.message)
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<SrunResult {self.summary()}>"

    def _repr_html_(self) -> str:
        m = self.final_metrics
        rows = [
            ("run", self.run.id),
            ("status", self.status),
            ("launcher", self.where),
            ("folder", str(self.run.path)),
            ("checkpoint", str(self.checkpoint or "-")),
            (
                "exit codes",
                ", ".join(
                    f"rank {r} on {self.hosts.get(r, '?')}: {'?' if c is None else c}"
                    for r, c in sorted(self.exit_codes.items())
                ),
            ),
            ("elapsed", f"{self.elapsed_s:.1f} s"),
        ]
        for key in ("step", "loss", "tokens_per_s", "mem_peak_gb"):
            if key in m:
                rows.append((key, f"{m[key]:,.4g}" if isinstance(m[key], float) else str(m[key])))
        body = "".join(
            f"<tr><th style='text-align:left'>{html.escape(k)}</th><td style='text-align:left'>"
            f"{html.escape(v)}</td></tr>"
            for k, v in rows
        )
        return f"<table>{body}</table>"


def last_result() -> SrunResult | None:
    """The result of the latest `srun(...)` in this process (also after an interrupt)."""
    return _last_result


# ---------------------------------------------------------------- progress display
def _in_kernel() -> bool:
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    ip = ipython.get_ipython()
    return ip is not None and getattr(ip, "kernel", None) is not None


class _Progress:
    """An in-place display (step / total, loss, tokens/s) updated from metrics.jsonl."""

    def __init__(self, title: str, total: int, enabled: bool):
        self.title, self.total, self.handle = title, total, None
        self.row: dict[str, Any] = {}
        self.eval_loss: float | None = None  # from the last row that has one (evaluations are sparser)
        self.state = "starting"
        self.t0 = time.time()
        if enabled:
            from IPython.display import display

            self.handle = display(self._data(), raw=True, display_id=True)

    def _data(self) -> dict[str, str]:
        step = int(self.row.get("step", 0))
        loss = f"{self.row['loss']:.4f}" if "loss" in self.row else "-"
        evaluated = f" eval_loss {self.eval_loss:.4f}" if self.eval_loss is not None else ""
        tps = f"{self.row['tokens_per_s']:,.0f}" if "tokens_per_s" in self.row else "-"
        elapsed = time.time() - self.t0
        text = (
            f"{self.title}  step {step}/{self.total}  loss {loss}{evaluated}  tokens/s {tps}  "
            f"{elapsed:.0f} s  [{self.state}]"
        )
        bar = int(30 * step / max(self.total, 1))
        plain = f"[{'#' * bar}{'.' * (30 - bar)}] {text}"
        color = {"completed": "#2e7d32", "failed": "#c62828", "interrupted": "#ef6c00"}.get(self.state, "#1565c0")
        markup = (
            f"<div style='font-family:monospace'><progress value='{step}' max='{self.total}' "
            f"style='width:24em;vertical-align:middle'></progress> {html.escape(self.title)} &middot; "
            f"step <b>{step}</b>/{self.total} &middot; loss <b>{loss}</b>{evaluated} &middot; {tps} tokens/s "
            f"&middot; {elapsed:.0f} s &middot; <span style='color:{color}'>{html.escape(self.state)}</span></div>"
        )
        return {"text/plain": plain, "text/html": markup}

    def update(self, row: dict[str, Any] | None = None, state: str | None = None) -> None:
        if row:
            self.row = row
            if row.get("eval_loss") is not None:
                self.eval_loss = float(row["eval_loss"])
        if state:
            self.state = state
        if self.handle is not None:
            self.handle.update(self._data(), raw=True)


class _MetricsTail:
    """New complete rows of metrics.jsonl since the last call (reads only new bytes)."""

    def __init__(self, path: Path):
        self.path, self.offset = path, 0

    def new_rows(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        rows = []
        for line in data[:end].splitlines():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return rows


# ---------------------------------------------------------------- running and watching one launch
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pdeathsig_shim(cmd: list[str]) -> list[str]:
    """Run `cmd` so that it gets SIGTERM if this (the kernel's main) thread dies: a kernel restart
    then cancels the step instead of leaving it running. Only from the main thread (the death
    signal follows the thread that forked)."""
    if threading.current_thread() is not threading.main_thread() or not sys.platform.startswith("linux"):
        return cmd
    shim = (
        "import ctypes,os,signal,sys\n"
        "try:\n    ctypes.CDLL(None).prctl(1, int(signal.SIGTERM))\nexcept Exception:\n    pass\n"
        "if os.getppid() != int(sys.argv[1]):\n    sys.exit(143)\n"
        "os.execvp(sys.argv[2], sys.argv[2:])"
    )
    return [sys.executable, "-c", shim, str(os.getpid()), *cmd]


def _squeue_steps(allocation: str) -> dict[str, str]:
    """{step id 'J.S': step name} of the allocation's live steps."""
    try:
        out = slurmcli.run(["squeue", "--steps", "-h", "-j", allocation, "-o", "%i|%j"], timeout=15)
    except slurmcli.SlurmError:
        return {}
    rows = {}
    for line in out.splitlines():
        step, _, name = line.strip().partition("|")
        if step:
            rows[step] = name
    return rows


class _Launch:
    """One launch: the launcher process, its output stream, the progress display, cancel."""

    def __init__(
        self,
        mode: str,
        spec: specmod.JobSpec,
        run: runfolder.RunFolder,
        *,
        all_ranks: bool,
        overlap: bool,
        srun_args: Sequence[str],
        progress: bool,
        grace_s: float,
        out: IO[str],
    ):
        self.mode, self.spec, self.run, self.all_ranks, self.grace_s, self.out = (
            mode,
            spec,
            run,
            all_ranks,
            grace_s,
            out,
        )
        self.world = spec.world_size
        self.allocation = os.environ.get("SLURM_JOB_ID", "")
        self.step_name = f"clusterfsdp-nb-{run.id}"
        self.job_id = self.allocation if mode == "srun" else ""  # the run folder's attempt key
        self.step = ""  # srun: '<job>.<step>', known once a task reports or squeue lists it
        self.hosts: dict[int, str] = {}
        self.codes: dict[int, int | None] = {}
        self.tails: dict[int, deque[str]] = {}
        self.srun_lines: deque[str] = deque(maxlen=40)
        self.hinted_busy = False
        self.started = time.time()
        self.metrics = _MetricsTail(run.metrics_file)
        self.progress = _Progress(f"{spec.job.name} {run.id}", spec.train.steps, progress)
        if mode == "srun":
            cmd = srun_command(spec, run.path, step_name=self.step_name, overlap=overlap, srun_args=srun_args)
        else:
            cmd = [sys.executable, "-u", "-m", "clusterfsdp.notebook", "_local", str(run.path), str(self.world)]
        env = launcher_env(mode, spec, all_ranks=all_ranks)
        try:
            self.proc = subprocess.Popen(
                _pdeathsig_shim(cmd),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as e:
            raise SrunError(f"could not start {cmd[0]}: {e}") from None
        self.pgid = self.proc.pid  # its own session: the session leader's pid is the group id
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True, name="clusterfsdp-notebook-reader")
        self.reader.start()
        if mode == "local":
            self.job_id = f"nb{self.proc.pid}"  # the supervisor's CLUSTERFSDP_JOB_ID (the shim keeps the pid)
        self._record_attempt()

    # -- output
    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.put(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        self.lines.put(None)

    def _print(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _handle(self, line: str) -> None:
        m = _LABEL.match(line)
        if not m:  # srun's own messages (or the local supervisor's): always shown
            if not line.strip():
                return
            self.srun_lines.append(line)
            em = _SRUN_TASK_ERROR.search(line)
            if em:
                self._srun_task_error(em.group(2), em.group(3))
            self._print(f"[{self.mode}] {line}")
            if "Requested nodes are busy" in line and not self.hinted_busy:
                self.hinted_busy = True
                self._print(
                    f"[{self.mode}] (another job step holds the allocation's resources: wait for it, cancel "
                    "it, or pass overlap=True to share them)"
                )
            return
        rank, text = int(m.group(1)), m.group(2)
        if text.startswith(MARK):
            self._marker(rank, text[len(MARK) :])
            return
        self.tails.setdefault(rank, deque(maxlen=30)).append(text)
        if rank == 0 or self.all_ranks:
            text = re.sub(rf"^\[rank{rank}\] ", "", text)
            self._print(f"[rank{rank} {self.hosts.get(rank, '?')}] {text}")

    def _marker(self, rank: int, text: str) -> None:
        fields = dict(item.split("=", 1) for item in text.split()[1:] if "=" in item)
        kind = text.split(" ", 1)[0]
        if kind == "task":
            self.hosts[rank] = fields.get("host", "?")
            if self.mode == "srun" and fields.get("step", "-") != "-":
                self._found_step(fields["step"])
        elif kind == "exit":
            code = fields.get("code", "")
            self.codes[rank] = int(code) if re.fullmatch(r"-?\d+", code) else None

    def _srun_task_error(self, tasks: str, what: str) -> None:
        m = re.search(r"exit code (\d+)", what)
        code = int(m.group(1)) if m else -9 if "Killed" in what else -15 if "Terminated" in what else None
        for part in tasks.split(","):
            lo, _, hi = part.partition("-")
            for r in range(int(lo), int(hi or lo) + 1):
                self.codes.setdefault(r, code)

    @property
    def where(self) -> str:
        """What to cancel, in words: the srun step (or the allocation while it waits), or the local job."""
        if self.mode == "local":
            return f"local job {self.job_id}"
        return f"srun step {self.step}" if self.step else f"srun (no job step yet) in allocation {self.job_id}"

    def _record_attempt(self) -> None:
        """The attempt goes into state.json at once, with the launcher's process group, so
        `clusterfsdp status` shows the run PENDING/RUNNING while it lives."""
        extra: dict[str, Any] = {"pgid": self.pgid, "host": socket.gethostname()}
        if self.mode == "srun":
            extra.update(allocation=self.allocation, step_name=self.step_name)
        self.run.add_attempt(
            job_id=self.job_id,
            executor=self.mode,
            reason="notebook srun" if self.mode == "srun" else "notebook (local processes)",
            world_size=self.world,
            **extra,
        )
        start = f"a job step of allocation {self.job_id}" if self.mode == "srun" else self.where
        self._print(f"[{self.mode}] {start}: {self.world} ranks, run folder {self.run.path}")

    def _found_step(self, step: str) -> None:
        if not self.step:
            self.step = step
            self.run.update_attempt(self.job_id, step=step)
            self._print(f"[srun] job step {step} started")

    def _refresh(self) -> None:
        rows = self.metrics.new_rows()
        state = "running" if self.hosts else None
        if rows or state:
            self.progress.update(rows[-1] if rows else None, state)

    def _drain(self, until: float) -> bool:
        """Handle output until the launcher exited and its output ended, or `until`; True if it ended."""
        last_refresh = 0.0
        while True:
            now = time.time()
            if now - last_refresh >= 1.0:
                self._refresh()
                last_refresh = now
            timeout = min(0.25, max(0.0, until - now))
            try:
                line = self.lines.get(timeout=timeout) if timeout > 0 else self.lines.get_nowait()
            except queue.Empty:
                line = ""
                if self.proc.poll() is not None and not self.reader.is_alive():
                    return True
                if time.time() >= until:
                    return self.proc.poll() is not None and not self.reader.is_alive()
                if self.proc.poll() is not None and time.time() - self._exited_at() > 2.0:
                    return True  # a grandchild holds the pipe open; the launcher itself is done
                continue
            if line is None:
                self.proc.wait()
                return True
            self._handle(line)

    _exit_seen: float | None = None

    def _exited_at(self) -> float:
        if self._exit_seen is None:
            self._exit_seen = time.time()
        return self._exit_seen

    # -- cancel
    def _lookup_step(self) -> str:
        """The step id, from squeue when no task has reported yet (srun may be waiting for resources)."""
        if not self.step:
            for step, name in _squeue_steps(self.allocation).items():
                if name == self.step_name:
                    self._found_step(step)
        return self.step

    def _signal(self, sig: signal.Signals) -> None:
        if self.mode == "srun":
            step = self._lookup_step()
            if step:
                try:
                    slurmcli.run(["scancel", f"--signal={sig.name.removeprefix('SIG')}", step], timeout=15)
                    return
                except slurmcli.SlurmError:
                    pass
            try:  # no step yet (srun still waiting for resources): stop srun itself
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass
        else:
            try:
                os.killpg(self.pgid, sig)
            except ProcessLookupError:
                pass

    def _gone(self) -> bool:
        if self.mode == "srun":
            if self.proc.poll() is None:
                return False
            return not self.step or self.step not in _squeue_steps(self.allocation)
        from ..control import launch

        return not launch.local_job_alive({"pgid": self.pgid})

    def cancel(self) -> tuple[float, str]:
        """SIGTERM every rank (they save at the next step boundary), SIGKILL after grace_s;
        returns (seconds until all ranks were gone, how)."""
        t0 = time.time()
        how = "SIGTERM"
        self._print(f"[{self.mode}] interrupted: cancelling {self.where} (SIGTERM, SIGKILL after {self.grace_s:g} s)")
        try:
            self._signal(signal.SIGTERM)
            self._drain(time.time() + self.grace_s)
        except KeyboardInterrupt:
            self._print(f"[{self.mode}] second interrupt: killing now")
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the rest is bounded (about 20 s at most)
        if not self._gone():
            how = "SIGKILL"
            self._signal(signal.SIGKILL)
            if self.mode == "srun" and self.step:
                try:
                    slurmcli.run(["scancel", self.step], timeout=15)
                except slurmcli.SlurmError:
                    pass
            self._drain(time.time() + 5)
            if self.proc.poll() is None:
                os.killpg(self.pgid, signal.SIGKILL)
        deadline = time.time() + 15
        while not self._gone() and time.time() < deadline:
            self._drain(time.time() + 0.3)
        if not self._gone():
            fix = f"scancel {self.step}" if self.mode == "srun" else f"kill -9 -{self.pgid}"
            raise SrunError(
                f"{self.where}: ranks still alive {time.time() - t0:.0f} s after the interrupt; "
                f"cancel it by hand: {fix}"
            )
        self.proc.wait()
        self._drain(time.time() + 0.5)
        return time.time() - t0, how

    # -- the whole launch
    def watch(self) -> SrunResult:
        global _last_result
        interrupted, gone_s, how = False, 0.0, ""
        try:
            self._drain(float("inf"))
            self.proc.wait()
        except KeyboardInterrupt:
            interrupted = True
            main = threading.current_thread() is threading.main_thread()
            previous = signal.getsignal(signal.SIGINT) if main else None
            if main:  # a second stop press during the grace period escalates to SIGKILL
                signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                gone_s, how = self.cancel()
            finally:
                if main:
                    signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        rc = self.proc.returncode
        result = self._result(rc, interrupted, gone_s, how)
        _last_result = result
        self.progress.update(result.final_metrics or None, result.status)
        return result

    def _result(self, rc: int | None, interrupted: bool, gone_s: float, how: str) -> SrunResult:
        if self.mode == "srun" and not self.step:  # never became a step (srun refused, or was stopped while waiting)
            return self._never_started(rc, interrupted, gone_s)
        for r in range(self.world):
            if r not in self.codes:
                self.codes[r] = 0 if rc == 0 and not interrupted else None
        events = [e for e in self.run.events() if str(e.get("job_id")) == self.job_id]
        end = next(
            (e for e in reversed(events) if e.get("event") in ("completed", "stopped", "failed", "requeued")), None
        )
        ck = ckptfolder.find(self.run.checkpoints_dir(self.spec))
        rows = self.run.metrics()
        ok = rc == 0 and all(c == 0 for c in self.codes.values())
        if interrupted:
            status = "interrupted"
            saved = (
                f"; saved step {end['step']}: {end.get('checkpoint')}" if end and end.get("event") == "stopped" else ""
            )
            message = (
                f"interrupted: {self.where} cancelled with {how}, all {self.world} ranks "
                f"gone {gone_s:.1f} s after the interrupt{saved}"
            )
            self.run.update_attempt(self.job_id, cancelled=time.time(), interrupt_to_gone_s=round(gone_s, 2))
        elif ok and (end is None or end.get("event") == "completed"):
            status, message = "completed", ""
        elif ok and end is not None and end.get("event") == "stopped":
            status, message = "stopped", f"stopped from outside: {end.get('reason', '')}"
        else:
            status = "failed"
            bad = sorted(r for r, c in self.codes.items() if c != 0)
            reason = (end or {}).get("reason", "")
            message = f"failed: {self.mode} exit status {rc}; ranks {bad or '?'} exited non-zero" + (
                f"; {reason}" if reason else ""
            )
        self.run.update_attempt(
            self.job_id, ended=time.time(), returncode=rc, exit_codes={str(r): c for r, c in sorted(self.codes.items())}
        )
        result = SrunResult(
            self.run,
            self.mode,
            self.job_id,
            self.step,
            status,
            rc,
            dict(sorted(self.codes.items())),
            dict(self.hosts),
            rows,
            ck.path if ck else None,
            time.time() - self.started,
            message,
        )
        if status == "failed":
            self._show_failure()
        return result

    def _show_failure(self) -> None:
        for r in sorted(r for r, c in self.codes.items() if c != 0):
            lines = list(self.tails.get(r, ()))
            if r == 0 or self.all_ranks or not lines:
                continue  # already shown live (or nothing to show)
            self._print(f"--- last output of rank {r} on {self.hosts.get(r, '?')} ---")
            for line in lines[-15:]:
                self._print(f"[rank{r} {self.hosts.get(r, '?')}] {line}")

    def _never_started(self, rc: int | None, interrupted: bool, gone_s: float) -> SrunResult:
        shutil.rmtree(self.run.path, ignore_errors=True)  # nothing half-created is left behind
        if interrupted:
            result = SrunResult(
                self.run,
                self.mode,
                self.job_id,
                "",
                "interrupted",
                rc,
                {},
                {},
                [],
                None,
                time.time() - self.started,
                f"interrupted before the step started "
                f"({gone_s:.1f} s to stop {self.mode}); nothing ran, run folder removed",
            )
            return result
        detail = " | ".join(self.srun_lines) or f"exit status {rc}"
        raise SrunError(f"{self.mode} did not start the job (exit status {rc}): {detail}")


def srun(
    job: str | os.PathLike[str] | specmod.JobSpec,
    *,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    tasks_per_node: int | None = None,
    overrides: Mapping[str, Any] | Iterable[str] | str | None = None,
    all_ranks: bool = False,
    overlap: bool = False,
    launcher: str = "auto",
    srun_args: Sequence[str] = (),
    progress: bool | None = None,
    grace_s: float = 3.0,
    check: bool = False,
    out: IO[str] | None = None,
) -> SrunResult:
    """Train `job` (a job.toml path, TOML text or a JobSpec) as a job step of the allocation this
    kernel runs in, or as local processes where there is no Slurm at all (see the module doc).

    nodes / gpus_per_node / tasks_per_node: the step's layout (default: the job's [slurm] values);
        one task per GPU. overrides: 'section.key=value' strings or {'section.key': value}.
    all_ranks: stream every rank's output (default: rank 0 only), each line prefixed `[rank<R> <host>]`.
    overlap: `srun --overlap` (share the allocation's resources with steps already running).
    launcher: 'auto', 'srun' (an error outside an allocation) or 'local'.
    srun_args: extra srun options, e.g. ['--nodelist=node2'].
    progress: the in-place progress display (default: on inside a Jupyter kernel).
    grace_s: after the stop button, seconds the ranks get to save at a step boundary before SIGKILL.
    check: raise StepFailed instead of returning a failed result.

    Returns an SrunResult; the stop button cancels the step and raises StepInterrupted (its
    `.result`, and `last_result()`, hold what was done).
    """
    out = out if out is not None else cast(IO[str], sys.stdout)
    spec = with_layout(load_job(job, overrides), nodes, gpus_per_node, tasks_per_node)
    mode, notice = choose_launcher(launcher)
    if mode == "srun":
        have = allocation_nodes()
        if have is not None and spec.slurm.nodes > have:
            raise SrunError(
                f"the step needs {spec.slurm.nodes} nodes but allocation {os.environ['SLURM_JOB_ID']} "
                f"has {have}: pass nodes={have} (or salloc more nodes)"
            )
    elif spec.slurm.nodes > 1:
        raise SrunError(
            f"slurm.nodes = {spec.slurm.nodes}: without Slurm the job runs as local processes on this "
            "machine; pass nodes=1 (or run the kernel inside `salloc -N{n}`)".replace("{n}", str(spec.slurm.nodes))
        )
    show = _in_kernel() if progress is None else progress
    run = runfolder.create_run(spec, mode)
    out.write(f"{notice}\n")
    for note in spec.notices():
        out.write(f"note: {note}\n")
    out.flush()
    try:
        launch = _Launch(
            mode,
            spec,
            run,
            all_ranks=all_ranks,
            overlap=overlap,
            srun_args=srun_args,
            progress=show,
            grace_s=grace_s,
            out=out,
        )
    except BaseException:
        shutil.rmtree(run.path, ignore_errors=True)
        raise
    result = launch.watch()
    if result.status == "interrupted":
        out.write(result.message + "\n")
        out.flush()
        raise StepInterrupted(result.message, result)
    out.write(result.summary() + "\n")
    out.flush()
    if check and result.status == "failed":
        raise StepFailed(result.message, result)
    return result


# ---------------------------------------------------------------- the processes: one rank, and the local supervisor
def _mark(text: str) -> None:
    stream = cast(IO[str], sys.__stdout__)
    stream.write(MARK + text + "\n")
    stream.flush()


def _task_main(run_dir: str) -> int:
    """One rank: report its host and step (the kernel prefixes its lines with the host and cancels
    the step by its id), run the worker, report the exit status (srun reports only failures)."""
    env = os.environ
    rank = env.get("SLURM_PROCID") or env.get("RANK") or "0"
    step = (
        f"{env['SLURM_JOB_ID']}.{env['SLURM_STEP_ID']}" if env.get("SLURM_JOB_ID") and env.get("SLURM_STEP_ID") else "-"
    )
    _mark(f"task rank={rank} host={socket.gethostname()} pid={os.getpid()} step={step}")
    from ..worker import main as worker

    code = 0
    try:
        worker.run(run_dir)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        if not isinstance(sys.stderr, worker.Tee):  # the worker prints its own tracebacks once it logs
            import traceback

            traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    _mark(f"exit rank={rank} code={code}")
    return code


def _local_main(run_dir: str, ntasks: int) -> int:
    """Local stand-in for srun: ntasks ranks with torchrun-style env in this process group,
    output labelled 'R: ' like `srun --label`, kill-on-bad-exit, exit status = the worst rank's."""
    stopping = threading.Event()

    def on_term(signum, frame):  # also reaches the ranks through the process group; forward if it did not
        stopping.set()
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signal.SIGTERM)
                except OSError:
                    pass

    procs: list[subprocess.Popen] = []
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    job_id = f"nb{os.getpid()}"
    port = _free_port()
    out = sys.stdout.buffer
    lock = threading.Lock()
    host = socket.gethostname()

    def pump(rank: int, stream) -> None:
        for raw in iter(stream.readline, b""):
            with lock:
                out.write(f"{rank}: ".encode() + (raw if raw.endswith(b"\n") else raw + b"\n"))
                out.flush()

    threads = []
    for rank in range(ntasks):
        env = dict(
            os.environ,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(ntasks),
            LOCAL_WORLD_SIZE=str(ntasks),
            GROUP_RANK="0",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            CLUSTERFSDP_JOB_ID=job_id,
        )
        if stopping.is_set():
            break
        p = subprocess.Popen(
            [sys.executable, "-u", "-m", "clusterfsdp.notebook", "_task", run_dir],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        procs.append(p)
        t = threading.Thread(target=pump, args=(rank, p.stdout), daemon=True)
        t.start()
        threads.append(t)
    codes: dict[int, int] = {}
    kill_at = None
    while len(codes) < len(procs):
        for rank, p in enumerate(procs):
            if rank not in codes and p.poll() is not None:
                codes[rank] = p.returncode
                if p.returncode != 0 and kill_at is None:  # like srun --kill-on-bad-exit
                    with lock:
                        out.write(
                            f"local: rank {rank} exited with status {p.returncode}: stopping the others\n".encode()
                        )
                        out.flush()
                    for q in procs:
                        if q.poll() is None:
                            q.send_signal(signal.SIGTERM)
                    kill_at = time.time() + 2.0
        if kill_at is not None and time.time() > kill_at:
            for q in procs:
                if q.poll() is None:
                    q.kill()
        time.sleep(0.05)
    for t in threads:
        t.join(timeout=2)
    with lock:
        for rank, code in sorted(codes.items()):
            out.write(f"{rank}: {MARK}exit rank={rank} code={code} host={host}\n".encode())
        out.flush()
    worst = max((128 - c if c < 0 else c for c in codes.values()), default=0)
    return worst


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 2 and argv[0] == "_task":
        return _task_main(argv[1])
    if len(argv) == 3 and argv[0] == "_local":
        return _local_main(argv[1], int(argv[2]))
    print(
        "usage: python -m clusterfsdp.notebook _task RUN_DIR | _local RUN_DIR NTASKS\n"
        "(internal entry points of clusterfsdp.notebook.srun)",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main())
