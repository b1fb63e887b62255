"""Submitting runs through submitit (Slurm or the local executor), resubmitting, cancelling.

The callable submitted is `WorkerCall(run_dir)`, which imports `clusterfsdp.worker.main` by
name on the compute node: the control plane never imports the worker (or torch). Every rank
reads the resolved job.toml from the run folder, so the pickle carries a path and no secrets.
Secret-looking [env] entries travel in the submitting process's environment instead
(sbatch exports it; the local executor inherits it).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from . import runfolder, slurmcli
from . import spec as specmod

Executor = Literal["auto", "slurm", "local"]
# Values that go into `#SBATCH --key=value` lines, which sbatch reads without a shell:
# a newline would start a new script line, so control characters are never allowed.
_SAFE_SBATCH_VALUE = re.compile(r"^[^\x00-\x1f\x7f]*$")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+,:@%=~-]+$")


class SubmitError(RuntimeError):
    pass


@dataclass(frozen=True)
class WorkerCall:
    """What submitit pickles and every rank calls: `clusterfsdp.worker.main.run(run_dir)`,
    imported by module name so that importing the control plane never imports the worker."""

    run_dir: str

    def __call__(self) -> str:
        import importlib

        return importlib.import_module("clusterfsdp.worker.main").run(self.run_dir)


@dataclass
class Submission:
    run: runfolder.RunFolder
    executor: str
    job_id: str
    notice: str


def choose_executor(requested: Executor) -> tuple[str, str]:
    """(executor, one-line notice saying why)."""
    if requested == "slurm":
        if not slurmcli.available():
            raise SubmitError(
                "--executor slurm: no Slurm controller answers `scontrol ping` (or sbatch is not on PATH)"
            )
        return "slurm", "executor: slurm (requested)"
    if requested == "local":
        return "local", "executor: local (requested): runs on this machine"
    if slurmcli.available():
        return "slurm", "executor: slurm (sbatch on PATH and the controller answers)"
    return "local", "executor: local (no reachable Slurm): runs on this machine with submitit's local executor"


def slurm_parameters(spec: specmod.JobSpec, dependency: str | None = None) -> dict[str, Any]:
    """Keyword arguments for submitit's SlurmExecutor / _make_sbatch_string."""
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
        params["mem"] = f"{int(s.mem_gb * 1024)}M"
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
    for key, value in [*params.items(), *extra.items()]:
        if isinstance(value, str) and not _SAFE_SBATCH_VALUE.match(value):
            raise SubmitError(f"slurm.{key}: control characters (newlines) are not allowed in sbatch options")
    return params


def _check_run_root(spec: specmod.JobSpec) -> None:
    root = str(Path(spec.job.run_root).expanduser().resolve())
    if not _SAFE_PATH.match(root):
        raise SubmitError(
            f"job.run_root: {root!r} has characters that sbatch option lines cannot carry "
            "(spaces, quotes, $, ...); choose a plain path"
        )


def worker_command(run: runfolder.RunFolder) -> str:
    return shlex.join([sys.executable, "-u", "-m", "clusterfsdp.worker", str(run.path)])


def render_sbatch(spec: specmod.JobSpec, run: runfolder.RunFolder) -> str:
    """The sbatch script for this run, as submitit renders it, running the worker module directly.

    Logs go straight into submitit/ (`<job id>_<task>_log.out`), not into a per-job `%j/` folder
    as with `submit`: Slurm does not create missing folders for --output, and nobody creates
    `submitit/<job id>/` for a script that is submitted by hand (the job fails with exit 53)."""
    from submitit.slurm.slurm import _make_sbatch_string

    return _make_sbatch_string(command=worker_command(run), folder=run.submitit_dir, **slurm_parameters(spec))


@contextlib.contextmanager
def _submission_env(spec: specmod.JobSpec) -> Iterator[None]:
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


def _submit_slurm(spec: specmod.JobSpec, run: runfolder.RunFolder, dependency: str | None) -> str:
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


def _submit_local(spec: specmod.JobSpec, run: runfolder.RunFolder) -> tuple[str, int]:
    """Start submitit's local controller in a new session so a Ctrl-C in this terminal
    (e.g. while following the log) does not reach the workers; returns (job id, pgid)."""
    import submitit

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: new session, submit, report the job id, exit
        os.close(read_fd)
        code = 0
        try:
            os.setsid()
            executor = submitit.LocalExecutor(folder=run.submitit_dir / "%j", max_num_timeout=spec.slurm.max_restarts)
            executor.update_parameters(
                tasks_per_node=spec.tasks_per_node,
                timeout_min=spec.time_minutes,
                signal_delay_s=spec.slurm.signal_grace_s,
                gpus_per_node=spec.slurm.gpus_per_node,
            )
            job = executor.submit(WorkerCall(str(run.path)))
            os.write(write_fd, f"ok {job.job_id} {os.getpid()}".encode())
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
    _, job_id, pgid = answer.split()
    return job_id, int(pgid)


def submit(
    spec: specmod.JobSpec,
    executor: Executor = "auto",
    *,
    run: runfolder.RunFolder | None = None,
    reason: str = "submit",
    resume_step: int | None = None,
    dependency: str | None = None,
) -> Submission:
    """Create the run folder (or reuse `run` for a resume) and queue one attempt."""
    chosen, notice = choose_executor(executor)
    _check_run_root(spec)
    if chosen == "local" and spec.slurm.nodes > 1:
        raise SubmitError(
            f"slurm.nodes = {spec.slurm.nodes}: the local executor runs on one machine; "
            "use Slurm (try `clusterfsdp devcluster up` for a local test cluster) or set slurm.nodes = 1"
        )
    if chosen == "slurm":
        slurm_parameters(spec, dependency)  # reject bad values before making folders
    from . import datasource

    problems = datasource.check(spec)
    if problems:
        raise SubmitError("; ".join(problems))
    new = run is None
    run = run or runfolder.create_run(spec, chosen)
    try:
        with _submission_env(spec):
            if chosen == "slurm":
                job_id, extra = _submit_slurm(spec, run, dependency), {}
            else:
                job_id, pgid = _submit_local(spec, run)
                extra = {"pgid": pgid}
    except BaseException:
        if new:  # nothing half-created is left behind
            import shutil

            shutil.rmtree(run.path, ignore_errors=True)
        raise
    run.add_attempt(job_id=job_id, executor=chosen, reason=reason, resume_step=resume_step, **extra)
    return Submission(run, chosen, job_id, notice)


def dry_run(spec: specmod.JobSpec) -> tuple[runfolder.RunFolder, str]:
    """Prepare a run folder and return the exact sbatch script for it (nothing is queued)."""
    _check_run_root(spec)
    run = runfolder.create_run(spec, "slurm")
    run.write_state({**run.state(), "dry_run": True})  # the worker records the hand-submitted job
    script = render_sbatch(spec, run)
    (run.path / "sbatch.sh").write_text(script)
    return run, script


def cancel(run: runfolder.RunFolder, grace_s: float = 20.0) -> str:
    """Cancel the run's live attempt. Workers get SIGTERM, save a checkpoint at the next step
    boundary and exit; stragglers are killed after `grace_s` (Slurm does this with KillWait)."""
    attempts = run.attempts
    if not attempts:
        raise SubmitError(f"run {run.id} has no submitted attempt")
    last = attempts[-1]
    if last["executor"] == "slurm":
        slurmcli.scancel(last["job_id"])
        run.update_attempt(last["job_id"], cancelled=time.time())
        return f"scancel {last['job_id']}: sent"
    pgid = last.get("pgid")
    if not pgid or not _group_alive(pgid):
        return f"run {run.id}: nothing running"
    run.update_attempt(last["job_id"], cancelled=time.time())
    os.killpg(pgid, signal.SIGTERM)
    deadline = time.time() + grace_s
    while time.time() < deadline and _group_alive(pgid):
        time.sleep(0.2)
    if _group_alive(pgid):
        os.killpg(pgid, signal.SIGKILL)
        return f"local job {last['job_id']}: killed after {grace_s:.0f} s"
    return f"local job {last['job_id']}: stopped"


def _group_alive(pgid: int) -> bool:
    """True while a non-zombie process of the group exists."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def local_job_alive(attempt: dict[str, Any]) -> bool:
    return bool(attempt.get("pgid")) and _group_alive(int(attempt["pgid"]))
