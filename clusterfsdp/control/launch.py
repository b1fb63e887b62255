"""Dispatch: how one attempt of a run is queued (Slurm: our own batch script through sbatch;
otherwise submitit's local executor on this machine), and the exact sbatch script of a dry run.
No run policy here: the run service (`control.run`) decides when an attempt may be submitted
and records it.

A Slurm attempt runs `python -m clusterfsdp.worker RUN_DIR` under srun, between two job steps
of the control plane (`clusterfsdp.control.jobstep`). The local executor pickles
`WorkerCall(run_dir)`, which imports `clusterfsdp.worker.main` by name: the control plane never
imports the worker (or torch). Every rank reads the resolved job.toml from the run folder, so
nothing queued carries a secret; secret [env] entries travel in the submitting process's
environment instead (sbatch exports it; the local executor inherits it).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import slurmcli
from . import spec as specmod
from .errors import UserError
from .procs import ProcessId
from .records import Executor
from .runfolder import RunFolder, atomic_write

Requested = Literal["auto", "slurm", "local"]
# Every path that reaches an `#SBATCH --output=...` line (the run folder's) is held to these.
# submitit's local controller restarts on exit code 144 at most this many times.
LOCAL_MAX_TIMEOUTS = 1_000_000
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._/+,:@%=~-]+$")


class SubmitError(UserError, RuntimeError):
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
    """(executor, one-line notice saying why). A machine where Slurm is configured but its
    controller does not answer (a restart, an outage) is waited for (bounded, slurmcli's retry
    budget), never silently replaced by the local executor: training would land on the login node."""
    if requested == "local":
        return Executor.LOCAL, "executor: local (requested): runs on this machine"
    state = slurmcli.controller()
    if state == "down":
        try:
            slurmcli.wait_for_controller("submit")
        except slurmcli.SlurmError as e:
            raise SubmitError(f"{e}; or use --executor local to run on this machine") from None
        state = "up"
    if requested == "slurm":
        if state != "up":
            raise SubmitError(
                "--executor slurm: no Slurm controller answers `scontrol ping` (or sbatch is not on PATH)"
            )
        return Executor.SLURM, "executor: slurm (requested)"
    if state == "up":
        return Executor.SLURM, "executor: slurm (sbatch on PATH and the controller answers)"
    return Executor.LOCAL, "executor: local (no reachable Slurm): runs on this machine with submitit's local executor"


@dataclass(frozen=True)
class TaskLaunch:
    """How each srun task starts the worker: options for srun, and the Python that runs
    `-m clusterfsdp.worker`, maybe inside a container (the batch script's job steps stay on the
    host's Python).

    - none: this Python (`sys.executable`), which must exist at the same path on every node.
    - pyxis: `srun --container-image=IMAGE --container-mounts=... --container-workdir=...`, then the
      image's Python. Host environment variables reach the container (the image's own win).
    - apptainer: `apptainer exec [--nv] --bind ... [--pwd DIR] IMAGE PYTHON`: the task is apptainer,
      which stays in the step's process tree, so Slurm's signals reach the worker.
    - oci: `srun --container=BUNDLE` (Slurm's oci.conf runtime; the bundle's config.json has the
      mounts, and Slurm 22.05 runs one task per node per step inside it).

    The run root and checkpoint.dir are mounted at their own paths, so the run folder has one path
    everywhere. Every value is held to an allowlist by `spec.check` and shell-quoted here."""

    srun_args: tuple[str, ...]
    python: tuple[str, ...]

    def command(self, *args: str) -> str:
        return shlex.join([*self.python, *args])


def task_launch(spec: specmod.JobSpec) -> TaskLaunch:
    c = spec.slurm.container
    if c.kind == "none":
        return TaskLaunch((), (sys.executable,))
    if c.kind == "oci":
        return TaskLaunch((f"--container={c.image}",), (c.python,))
    mounts = _container_mounts(spec)
    if c.kind == "pyxis":
        args = [f"--container-image={c.image}", f"--container-mounts={','.join(mounts)}"]
        args += [f"--container-workdir={c.workdir}"] if c.workdir else []
        return TaskLaunch((*args, *c.options), (c.python,))
    python = ["apptainer", "exec", *(["--nv"] if spec.slurm.gpus_per_node else []), "--bind", ",".join(mounts)]
    python += ["--pwd", c.workdir] if c.workdir else []
    return TaskLaunch((), (*python, *c.options, c.image, c.python))


def _container_mounts(spec: specmod.JobSpec) -> list[str]:
    """The run root and checkpoint.dir at their own paths, then the job's own mounts."""
    own = [str(Path(p).expanduser().resolve()) for p in (spec.job.run_root, spec.checkpoint.dir) if p]
    return list(dict.fromkeys([f"{p}:{p}" for p in own] + spec.slurm.container.mounts))


def check_container(spec: specmod.JobSpec, executor: Executor) -> None:
    """What the job file cannot say about itself: where the container can run."""
    c = spec.slurm.container
    if c.kind == "none":
        return
    if executor is not Executor.SLURM:
        raise SubmitError(
            f"slurm.container.kind = {c.kind!r}: containers are started by srun; the local executor runs "
            "this machine's Python (--set slurm.container.kind=none to run here)"
        )
    for path in (spec.job.run_root, spec.checkpoint.dir):
        resolved = str(Path(path).expanduser().resolve()) if path else ""
        if resolved and not specmod.MOUNT_PATH.fullmatch(resolved):
            raise SubmitError(f"slurm.container: {resolved!r} cannot be mounted (',' or ':' in the path)")
    version = slurmcli.version() if c.kind == "oci" and spec.tasks_per_node > 1 else None
    if version is not None and version < (23, 2):
        raise SubmitError(
            f"slurm.container.kind = 'oci': Slurm {version[0]}.{version[1]:02d} runs one task per node in an OCI "
            f"container, and this job has {spec.tasks_per_node} per node; use pyxis or apptainer, or one "
            "GPU/task per node (Slurm 23.02 lifts the limit)"
        )


_TRACKER_MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def check_trackers(spec: specmod.JobSpec) -> None:
    """The workers run this Python (no container): the tracker packages must be importable here,
    or the run would fail after queueing. Looked up without importing them."""
    if spec.slurm.container.kind != "none":
        return  # the image's Python: only the worker can tell
    import importlib.util

    for name in spec.log.trackers:
        if importlib.util.find_spec(_TRACKER_MODULES[name]) is None:
            raise SubmitError(
                f"log.trackers: {name!r} is not installed in {sys.executable} (the workers' Python); "
                "pip install 'clusterfsdp[trackers]'"
            )


def sbatch_options(
    spec: specmod.JobSpec, dependency: str | None = None, exclude: tuple[str, ...] = ()
) -> list[tuple[str, str | None]]:
    """The `#SBATCH` options of an attempt, as (name, value or None for a flag). Every string
    value from the job file was held to an allowlist by `spec.check` (the `#SBATCH` parser
    honours quotes and backslashes), so nothing here can add an option the job file did not name.

    `--no-kill`: when a node fails, Slurm shrinks the allocation instead of ending (and
    requeueing) the job, so the batch script lives on to classify the failure and resubmit
    without that node (docs/recovery.md). The batch host's own failure still ends the job."""
    s = spec.slurm
    opts: list[tuple[str, str | None]] = [
        ("job-name", spec.job.name),
        ("nodes", str(s.nodes)),
        ("ntasks-per-node", str(spec.tasks_per_node)),
        ("time", str(spec.time_minutes)),
        ("signal", f"USR2@{s.signal_grace_s}"),
        ("requeue" if s.requeue else "no-requeue", None),
        ("no-kill", None),
        ("open-mode", "append"),
    ]
    if s.gpus_per_node:
        opts.append(("gpus-per-node", str(s.gpus_per_node)))
    if s.cpus_per_task:
        opts.append(("cpus-per-task", str(s.cpus_per_task)))
    if s.mem_gb:
        opts.append(("mem", f"{math.ceil(s.mem_gb * 1024)}M"))
    for key in ("partition", "account", "qos", "constraint"):
        if getattr(s, key):
            opts.append((key, getattr(s, key)))
    if s.exclusive:
        opts.append(("exclusive", None))
    if dependency:
        opts.append(("dependency", dependency))
    extra = dict(s.extra)
    if exclude:
        given = [str(extra.pop("exclude"))] if "exclude" in extra else []
        opts.append(("exclude", ",".join([*given, *exclude])))
    for key, value in sorted(extra.items()):
        if value is True:
            opts.append((key, None))
        elif value is not False:
            opts.append((key, str(value)))
    return opts


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


def render_sbatch(
    spec: specmod.JobSpec, run: RunFolder, *, dependency: str | None = None, exclude: tuple[str, ...] = ()
) -> str:
    """The batch script of an attempt (also what `submit --dry-run` writes as sbatch.sh).

    Around `srun` run the job steps of the control plane on the batch host
    (`clusterfsdp.control.jobstep`): `before` records what Slurm did to the previous incarnation
    and stops a run that used up its restarts; `after` classifies a failed attempt and submits
    the next one (docs/recovery.md). `--kill-on-bad-exit`: one rank that dies ends the step at
    once, instead of leaving the others blocked in a collective. The job steps run this Python on
    the host; the ranks start as `task_launch(spec)` says (maybe the image's Python, in a
    container). Logs go straight into submitit/ (`<job id>_<task>_log.out`): Slurm does not
    create missing folders for --output."""
    py, folder = shlex.quote(sys.executable), shlex.quote(str(run.path))
    out = run.submitit_dir
    lines = [
        "#!/bin/bash",
        f"# clusterfsdp run {run.id}: written by clusterfsdp (submit, resume, or an automatic restart);",
        "# submitting it by hand (`submit --dry-run`) behaves the same.",
    ]
    options = [
        *sbatch_options(spec, dependency, exclude),
        ("output", f"{out}/%j_0_log.out"),
        ("error", f"{out}/%j_0_log.err"),
    ]
    lines += [f"#SBATCH --{key}" + ("" if value is None else f"={shlex.quote(value)}") for key, value in options]
    if spec.slurm.setup:
        lines += ["", "# slurm.setup", *spec.slurm.setup]
    task = task_launch(spec)
    srun = [
        "srun",
        "--unbuffered",
        "--kill-on-bad-exit=1",
        f"--output={out}/%j_%t_log.out",
        f"--error={out}/%j_%t_log.err",
        *task.srun_args,
    ]
    lines += [
        "",
        f"PY={py}",
        f"RUN={folder}",
        '"$PY" -m clusterfsdp.control.jobstep before "$RUN" || exit $?',
        f'{shlex.join(srun)} {task.command("-u", "-m", "clusterfsdp.worker")} "$RUN"',
        'exec "$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"',
        "",
    ]
    return "\n".join(lines)


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
    """One queued attempt: the job id; for the local executor the process group leader; for
    Slurm `held` (the job waits until `start` is called, once the attempt is recorded)."""

    job_id: str
    leader: ProcessId | None = None
    held: bool = False


def queue(
    spec: specmod.JobSpec,
    executor: Executor,
    run: RunFolder,
    dependency: str | None = None,
    exclude: tuple[str, ...] = (),
) -> Queued:
    """Queue one attempt of `run` (its folder and job.toml exist) on `executor`."""
    with submission_env(spec):
        if executor is Executor.SLURM:
            return Queued(_queue_slurm(spec, run, dependency, exclude), held=True)
        return _queue_local(spec, run)


def start(queued: Queued) -> None:
    """Let a held Slurm attempt start (after the run service recorded it)."""
    if queued.held:
        try:
            slurmcli.release(queued.job_id)
        except slurmcli.SlurmError as e:
            raise SubmitError(
                f"job {queued.job_id} is queued but held ({e}); `scontrol release {queued.job_id}` starts it"
            ) from None


def _queue_slurm(spec: specmod.JobSpec, run: RunFolder, dependency: str | None, exclude: tuple[str, ...]) -> str:
    """sbatch the attempt's script, held, with a unique --comment (slurmcli.submit)."""
    script = run.submitit_dir / f"attempt-{len(run.record().attempts)}.sh"
    atomic_write(script, render_sbatch(spec, run, dependency=dependency, exclude=exclude))
    token = f"clusterfsdp:{run.id}:{secrets.token_hex(4)}"
    try:
        return slurmcli.submit(script, token, str(spec.slurm.extra.get("comment", "")))
    except slurmcli.SlurmError as e:
        raise SubmitError(str(e) if e.transient else _one_line_sbatch_error(str(e))) from None


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
            # The worker alone bounds comebacks (outcomes.restarts_used: an interruption that made
            # progress costs nothing), so the controller must not stop restarting before it does.
            executor = submitit.LocalExecutor(folder=run.submitit_dir / "%j", max_num_timeout=LOCAL_MAX_TIMEOUTS)
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
