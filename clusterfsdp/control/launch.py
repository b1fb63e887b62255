"""Dispatch: how one attempt of a run is queued through submitit (Slurm's sbatch, or submitit's
local executor on this machine), and the exact sbatch script of a dry run. No run policy here:
the run service (`control.run`) decides when an attempt may be submitted and records it.

The callable submitted is `WorkerCall(run_dir)`, which imports `clusterfsdp.worker.main` by
name on the compute node: the control plane never imports the worker (or torch). Every rank
reads the resolved job.toml from the run folder, so the pickle carries a path and no secrets.
Secret [env] entries travel in the submitting process's environment instead (sbatch exports
it; the local executor inherits it).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import slurmcli
from . import spec as specmod
from .procs import ProcessId
from .records import Executor
from .runfolder import RunFolder

Requested = Literal["auto", "slurm", "local"]
# Every path that reaches an `#SBATCH --output=...` line (the run folder's) is held to these.
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+,:@%=~-]+$")


class SubmitError(RuntimeError):
    """The attempt could not be queued; the message is one line for the user."""


@dataclass(frozen=True)
class WorkerCall:
    """What submitit pickles and every rank calls: `clusterfsdp.worker.main.run(run_dir)`,
    imported by module name so that importing the control plane never imports the worker."""

    run_dir: str

    def __call__(self) -> str:
        import importlib

        return importlib.import_module("clusterfsdp.worker.main").run(self.run_dir)


def choose_executor(requested: Requested) -> tuple[Executor, str]:
    """(executor, one-line notice saying why)."""
    if requested == "slurm":
        if not slurmcli.available():
            raise SubmitError(
                "--executor slurm: no Slurm controller answers `scontrol ping` (or sbatch is not on PATH)"
            )
        return Executor.SLURM, "executor: slurm (requested)"
    if requested == "local":
        return Executor.LOCAL, "executor: local (requested): runs on this machine"
    if slurmcli.available():
        return Executor.SLURM, "executor: slurm (sbatch on PATH and the controller answers)"
    return Executor.LOCAL, "executor: local (no reachable Slurm): runs on this machine with submitit's local executor"


def slurm_parameters(spec: specmod.JobSpec, dependency: str | None = None) -> dict[str, Any]:
    """Keyword arguments for submitit's SlurmExecutor / _make_sbatch_string. Every string value
    from the job file was held to an allowlist by `spec.check` (the `#SBATCH` parser honours
    quotes and backslashes), so nothing here can add an option the job file did not name."""
    s = spec.slurm
    params: dict[str, Any] = dict(
        job_name=spec.job.name,
        nodes=s.nodes,
        ntasks_per_node=spec.tasks_per_node,
        time=spec.time_minutes,
        signal_delay_s=s.signal_grace_s,
    )
    if s.gpus_per_node:
        params["gpus_per_node"] = s.gpus_per_node
    if s.cpus_per_task:
        params["cpus_per_task"] = s.cpus_per_task
    if s.mem_gb:
        params["mem"] = f"{math.ceil(s.mem_gb * 1024)}M"
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key):
            params[key] = getattr(s, key)
    if s.exclusive:
        params["exclusive"] = True
    if s.setup:
        params["setup"] = list(s.setup)
    extra: dict[str, Any] = {"requeue" if s.requeue else "no-requeue": True}
    if dependency:
        extra["dependency"] = dependency
    extra.update(s.extra)
    params["additional_parameters"] = extra
    return params


def check_run_root(spec: specmod.JobSpec) -> None:
    """The run root can hold run folders and can be named on an `#SBATCH --output` line."""
    root = Path(spec.job.run_root).expanduser().resolve()
    if not _SAFE_PATH.match(str(root)):
        raise SubmitError(
            f"job.run_root: {str(root)!r} has characters that sbatch option lines cannot carry "
            "(spaces, quotes, $, ...); choose a plain path"
        )
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        raise SubmitError(f"job.run_root: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SubmitError(f"job.run_root: {existing} is not writable by you")


def worker_command(run: RunFolder) -> str:
    return shlex.join([sys.executable, "-u", "-m", "clusterfsdp.worker", str(run.path)])


def render_sbatch(spec: specmod.JobSpec, run: RunFolder) -> str:
    """The sbatch script for this run, as submitit renders it, running the worker module directly.

    Logs go straight into submitit/ (`<job id>_<task>_log.out`), not into a per-job `%j/` folder
    as with `submit`: Slurm does not create missing folders for --output, and nobody creates
    `submitit/<job id>/` for a script that is submitted by hand (the job fails with exit 53)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command=worker_command(run), folder=run.submitit_dir, **slurm_parameters(spec))


@contextlib.contextmanager
def submission_env(spec: specmod.JobSpec) -> Iterator[None]:
    """Scrub inherited SLURM_*/SRUN_* (submitting from inside an allocation causes GRES errors and
    pinned CPUs) and put secret [env] entries into the environment the job inherits."""
    from submitit.helpers import clean_env

    secrets = specmod.secret_env(spec)
    saved = {k: os.environ.get(k) for k in secrets}
    os.environ.update(secrets)
    try:
        with clean_env():
            yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@dataclass(frozen=True)
class Queued:
    """One queued attempt: the job id, and for the local executor the process group leader."""

    job_id: str
    leader: ProcessId | None = None


def queue(spec: specmod.JobSpec, executor: Executor, run: RunFolder, dependency: str | None = None) -> Queued:
    """Queue one attempt of `run` (its folder and job.toml exist) on `executor`."""
    with submission_env(spec):
        if executor is Executor.SLURM:
            return Queued(_queue_slurm(spec, run, dependency))
        return _queue_local(spec, run)


def _queue_slurm(spec: specmod.JobSpec, run: RunFolder, dependency: str | None) -> str:
    import submitit
    from submitit.core.utils import FailedJobError, FailedSubmissionError

    executor = submitit.SlurmExecutor(folder=run.submitit_dir / "%j", max_num_timeout=spec.slurm.max_restarts)
    executor.update_parameters(**slurm_parameters(spec, dependency))
    try:  # submitit also prints sbatch's stderr on failure; the exception carries it, shown once below
        with contextlib.redirect_stderr(io.StringIO()):
            job = executor.submit(WorkerCall(str(run.path)))
    except (FailedJobError, FailedSubmissionError, OSError) as e:
        raise SubmitError(_one_line_sbatch_error(str(e))) from None
    return str(job.job_id)


def _one_line_sbatch_error(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if "error" in line.lower()]
    return "sbatch refused the job: " + (lines[-1] if lines else " ".join(text.split())[:300])


def _queue_local(spec: specmod.JobSpec, run: RunFolder) -> Queued:
    """Start submitit's local controller in a new session, so a Ctrl-C in this terminal (e.g.
    while following the log) does not reach the workers, with its stdio on a log file in the
    run folder, so `RUN=$(clusterfsdp submit ...)` or `| tee` return at once instead of holding
    the pipe open for the whole run. The session leader's identity is recorded for cancel."""
    import submitit

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: new session, detached stdio, submit, report, exit
        os.close(read_fd)
        code = 0
        try:
            os.setsid()
            log = os.open(run.submitit_dir / "local-controller.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            devnull = os.open(os.devnull, os.O_RDONLY)
            os.dup2(devnull, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            executor = submitit.LocalExecutor(folder=run.submitit_dir / "%j", max_num_timeout=spec.slurm.max_restarts)
            executor.update_parameters(
                tasks_per_node=spec.tasks_per_node,
                timeout_min=spec.time_minutes,
                signal_delay_s=spec.slurm.signal_grace_s,
                gpus_per_node=spec.slurm.gpus_per_node,
            )
            job = executor.submit(WorkerCall(str(run.path)))
            leader = ProcessId.of(os.getpid())
            os.write(write_fd, f"ok {job.job_id} {leader.pid} {leader.start}".encode())
        except BaseException as e:
            os.write(write_fd, f"error {type(e).__name__}: {e}".encode())
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        answer = f.read()
    os.waitpid(pid, 0)
    if not answer.startswith("ok "):
        raise SubmitError(f"local executor: {answer.removeprefix('error ') or 'submission process died'}")
    _, job_id, leader_pid, start = answer.split()
    here = ProcessId.of(os.getpid())
    return Queued(job_id, ProcessId(int(leader_pid), int(start), here.host, here.boot))
