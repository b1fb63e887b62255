"""Dispatch: how one attempt of a run is queued, always by submitit (Slurm: its
`SlurmExecutor`, with sbatch sent through slurmcli's retries, `control.slurmexec`; otherwise its
`LocalExecutor` on this machine), and the exact batch script of a dry run. No run policy here:
the run service (`control.run`) decides when an attempt may be submitted and records it.

Both executors pickle `WorkerCall(run_dir)`, which imports `clusterfsdp.worker.main` by name: the
control plane never imports the worker (or torch). On Slurm, submitit's batch script runs the
control plane's job steps (`clusterfsdp.control.jobstep`) around its srun line: `before` as the
last `setup` line, `after` as the `teardown` (with srun's exit status). Every rank reads the
resolved job.toml from the run folder, so nothing queued carries a secret; secret [env] entries
travel in the submitting process's environment instead (sbatch exports it; the local executor
inherits it).

A little over 500 lines: the checks of what may reach sbatch (run root, containers, trackers) sit
beside the submitit parameters they guard, so one module says everything an attempt is queued with.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import re
import secrets
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..core import ownership, runfolder, slurmcli, warmlaunch
from ..core import spec as specmod
from ..core.errors import UserError
from ..core.procs import ProcessId
from ..core.records import Attempt, Executor
from ..core.runfolder import RunFolder
from ..core.value import value

if TYPE_CHECKING:
    # submitit only when a job is queued (heavy: cloudpickle), not for every Run
    import submitit

    from .slurmexec import RetriedSlurmExecutor

Requested = Literal["auto", "slurm", "local"]
OCI_TASK = "clusterfsdp.worker.ocitask"  # runs submitit's task module inside an OCI container
# submitit's local controller restarts on exit code 144 at most this many times.
LOCAL_MAX_TIMEOUTS = 1_000_000
# Every path that reaches an `#SBATCH --output=...` line (the run folder's) is held to these.
_SAFE_PATH = r"^[A-Za-z0-9._/+,:@=~-]+$"


class SubmitError(UserError, RuntimeError):
    """The attempt could not be queued; the message is one line for the user."""


@value(frozen=True)
class WorkerCall:
    """What submitit pickles and every rank calls: `clusterfsdp.worker.main.run(run_dir)`,
    imported by module name so that importing the control plane never imports the worker.

    submitit's `_submit` installs its own handlers just before calling this: SIGTERM and SIGCONT
    ignored (logged), SIGUSR2 `scontrol requeue` and exit. The worker decides what a stop signal
    means (its stop flags, installed first thing in `run`; outcomes.classify_stop), so they are
    put back to the defaults here at once: during the import below a signal ends the rank, as
    before any Python ran, instead of being lost or requeueing the job behind the worker's back."""

    run_dir: str

    def __call__(self) -> str:
        for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT):
            signal.signal(sig, signal.SIG_DFL)
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


@value(frozen=True)
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
      mounts, and Slurm 22.05 runs one task per node per step inside it), then the bundle's
      `PYTHON -u -m clusterfsdp.worker.ocitask`, which gives the task its own SLURM_PROCID (the
      container has the batch step's) before it runs submitit's task module.

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
    if c.kind == "oci":  # the task's own Slurm task numbers set before submitit reads them (worker/ocitask.py)
        return TaskLaunch((f"--container={c.image}",), (c.python, "-u", "-m", OCI_TASK))
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
        if resolved and not re.fullmatch(specmod.MOUNT_PATH, resolved):
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

    for name in spec.log.trackers:
        if importlib.util.find_spec(_TRACKER_MODULES[name]) is None:
            raise SubmitError(
                f"log.trackers: {name!r} is not installed in {sys.executable} (the workers' Python); "
                "pip install 'clusterfsdp[trackers]'"
            )


@value(frozen=True)
class NodeResources:
    """What each task and node asks of Slurm beyond its task count, rendered once for both of
    the ways a job's ranks are started: submitit's sbatch parameters (`sbatch_options`) and a
    notebook's srun line (`notebook.placement.srun_command`). The two had been written apart
    and diverged: --mem is rounded up to whole MiB here, never below what slurm.mem_gb asks."""

    gpus_per_node: int = 0
    cpus_per_task: int = 0
    mem_mb: int = 0  # per node; 0: Slurm's default

    @classmethod
    def of(cls, s: specmod.SlurmSection) -> NodeResources:
        return cls(s.gpus_per_node, s.cpus_per_task, math.ceil(s.mem_gb * 1024) if s.mem_gb else 0)

    def parameters(self) -> dict[str, Any]:
        """As submitit's parameters (None: not asked; submitit writes `--gpus-per-node=...`)."""
        return {
            "gpus_per_node": self.gpus_per_node or None,
            "cpus_per_task": self.cpus_per_task or None,
            "mem": f"{self.mem_mb}M" if self.mem_mb else None,
        }

    def flags(self) -> list[str]:
        """As srun's options: the same names and values as the sbatch lines."""
        return [f"--{key.replace('_', '-')}={value}" for key, value in self.parameters().items() if value is not None]


def sbatch_options(
    spec: specmod.JobSpec,
    dependency: str | None = None,
    exclude: tuple[str, ...] = (),
    *,
    token: str = "",
    hold: bool = False,
) -> dict[str, Any]:
    """The parameters of submitit's `SlurmExecutor` for an attempt (`update_parameters`):
    submitit's own for what it names, `additional_parameters` for `#SBATCH` options it does not
    (its `_as_sbatch_flag` writes each `--key=value`, shell-quoted, or `--flag` for True). Every
    string value from the job file was held to an allowlist by `spec.check` (the `#SBATCH` parser
    honours quotes and backslashes), so nothing here can add an option the job file did not name.

    `--no-kill`: when a node fails, Slurm shrinks the allocation instead of ending (and
    requeueing) the job, so the batch script lives on to classify the failure and resubmit
    without that node (docs/recovery.md). The batch host's own failure still ends the job.
    `--signal=USR2@grace` whatever SUBMITIT_PREEMPT_SIGNAL says: the worker's stop flags listen
    for SIGUSR2. `token` joins the job's `--comment` (found again after an unanswered sbatch) and
    `hold` keeps it from starting until the attempt is recorded; a dry run has neither."""
    s = spec.slurm
    extra = dict(s.extra)
    comment = " ".join(part for part in (str(extra.pop("comment", "")), token) if part)
    if exclude:
        given = [str(extra.pop("exclude"))] if "exclude" in extra else []
        extra["exclude"] = ",".join([*given, *exclude])
    nodes = spec.node_range  # (parsed by spec.check; rendered again here, never the job file's text)
    additional: dict[str, Any] = {
        # a range on the --nodes line; submitit's own `nodes` (its task count) is the largest size
        **({"nodes": nodes.render()} if nodes.elastic else {}),
        **({"time-min": specmod.parse_time_minutes(s.time_min)} if s.time_min not in (0, "") else {}),
        "signal": f"USR2@{s.signal_grace_s}",
        "requeue" if s.requeue else "no-requeue": True,
        "no-kill": True,
        **({"hold": True} if hold else {}),
        # waiting for a prepare array (control/prepjob.py): cancelled by Slurm if that fails
        **({"kill-on-invalid-dep": "yes"} if dependency and dependency.startswith("afterok:") else {}),
        **{key: value if value is True else str(value) for key, value in extra.items() if value is not False},
    }
    chosen: dict[str, Any] = {
        "job_name": spec.job.name,
        "nodes": nodes.high,
        "ntasks_per_node": spec.tasks_per_node,
        "time": spec.time_minutes,
        "signal_delay_s": s.signal_grace_s,
        **NodeResources.of(s).parameters(),
        "partition": s.partition or None,
        "account": s.account or None,
        "qos": s.qos or None,
        "constraint": s.constraint or None,
        "exclusive": True if s.exclusive else None,
        "dependency": dependency,
        "comment": comment or None,
        "wckey": None,  # submitit's default "submitit" is refused where wckeys are enforced
        "srun_args": ["--kill-on-bad-exit=1", *task_launch(spec).srun_args],
        "additional_parameters": additional,
    }
    return {key: value for key, value in chosen.items() if value is not None or key == "wckey"}


def job_steps(run: RunFolder) -> tuple[list[str], list[str]]:
    """submitit's `setup` and `teardown` lines around its srun line: the control plane's job
    steps on the batch host (`clusterfsdp.control.jobstep`, this Python): `before` records what
    Slurm did to the previous incarnation and stops a run that used up its restarts; `after`
    (with srun's exit status, the last command before it) classifies a failed attempt and
    submits the next one (docs/recovery.md)."""
    return job_steps_for(f"run {run.id}", f"RUN={shlex.quote(str(run.path))}")


def job_steps_for(label: str, run_line: str) -> tuple[list[str], list[str]]:
    setup = [
        f"# clusterfsdp {label}: the control plane's job steps around srun (clusterfsdp.control.jobstep)",
        f"PY={shlex.quote(sys.executable)}",
        run_line,
        '"$PY" -m clusterfsdp.control.jobstep before "$RUN" || exit $?',
    ]
    return setup, ['exec "$PY" -m clusterfsdp.control.jobstep after "$RUN" "$?"']


def check_run_root(spec: specmod.JobSpec) -> None:
    """The one run-root check of submit, the dry run and the notebook: a path sbatch lines can
    carry, writable by its permissions, and a place where a folder can really be made (root
    passes every permission check, and some file systems, /proc for one, still refuse). The
    probe folder is removed at once: a refused job leaves nothing behind."""
    root = Path(spec.job.run_root).expanduser().resolve()
    if "%" in str(root):  # sbatch and srun expand %j, %x, ... in --output: the logs would go elsewhere
        raise SubmitError(f"job.run_root: {str(root)!r} has '%', which Slurm expands in log file names")
    if not re.match(_SAFE_PATH, str(root)):
        raise SubmitError(
            f"job.run_root: {str(root)!r} has characters that sbatch option lines cannot carry "
            "(spaces, quotes, $, ...); choose a plain path"
        )
    existing = next((p for p in (root, *root.parents) if p.exists()), Path("/"))
    if not existing.is_dir():
        raise SubmitError(f"job.run_root: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SubmitError(f"job.run_root: {existing} is not writable by you")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".clusterfsdp-probe-", dir=existing))
    except OSError as e:
        raise SubmitError(f"job.run_root: cannot create {root} ({existing}: {e.strerror or e})") from None


def slurm_executor(
    spec: specmod.JobSpec,
    run: RunFolder,
    *,
    dependency: str | None = None,
    exclude: tuple[str, ...] = (),
    token: str = "",
) -> RetriedSlurmExecutor:
    """submitit's `SlurmExecutor` for an attempt (`control.slurmexec`). With a `token` it queues
    held jobs into `submitit/<job id>/` (the job cannot start before submitit made that folder,
    which Slurm needs for --output); without one it renders the dry run's script, whose job
    writes straight into `submitit/` (a job submitted by hand could start before anyone made a
    folder for its id). The ranks start as `task_launch(spec)` says (maybe the image's Python, in
    a container), which runs `-u -m submitit.core._submit FOLDER`."""
    folder = run.submitit_dir / "%j" if token else run.submitit_dir
    parameters = sbatch_options(spec, dependency, exclude, token=token, hold=bool(token))
    return executor_for(spec, folder, job_steps(run), parameters, token)


def executor_for(
    spec: specmod.JobSpec, folder: Path, steps: tuple[list[str], list[str]], parameters: dict[str, Any], token: str
) -> RetriedSlurmExecutor:
    # submitit (with cloudpickle) only when a Slurm job is queued, not for every Run
    from . import slurmexec

    setup, teardown = steps
    parameters.update(setup=[*spec.slurm.setup, *setup], teardown=teardown)
    python = shlex.join(task_launch(spec).python)
    comment = str(spec.slurm.extra.get("comment", ""))
    return slurmexec.executor(folder, python, parameters, token=token, comment=comment)


def render_sbatch(
    spec: specmod.JobSpec, run: RunFolder, *, dependency: str | None = None, exclude: tuple[str, ...] = ()
) -> str:
    """The batch script of an attempt as submitit writes it, without the hold and the unique
    comment: what `submit --dry-run` writes as sbatch.sh (the job step `before` puts the pickled
    call where submitit looks for it), and what the TUI shows."""
    return slurm_executor(spec, run, dependency=dependency, exclude=exclude).script()


@contextlib.contextmanager
def submission_env(spec: specmod.JobSpec) -> Iterator[None]:
    """Scrub inherited SLURM_*/SRUN_* (submitting from inside an allocation causes GRES errors and
    pinned CPUs), except what finds the cluster (slurmcli.CLUSTER_ENV), and put secret [env] entries into
    the environment the job inherits."""
    # submitit only when a job is queued (heavy: cloudpickle), not for every Run
    from submitit.helpers import clean_env

    secrets = specmod.secret_env(spec)
    saved = {k: os.environ.get(k) for k in secrets}
    os.environ.update(secrets)
    cluster = {k: os.environ[k] for k in slurmcli.CLUSTER_ENV if k in os.environ}
    try:
        with clean_env():
            os.environ.update(cluster)
            try:
                yield
            finally:
                for k in cluster:  # clean_env puts back what it took
                    os.environ.pop(k, None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@value(frozen=True)
class Queued:
    """One queued attempt: the job id; for the local executor the process group leader; for
    Slurm `held` (the job waits until `start` is called, once the attempt is recorded); `job`:
    submitit's job object (state, `result()`, logs), for a caller that wants it."""

    job_id: str
    leader: ProcessId | None = None
    held: bool = False
    job: Any = None
    notes: tuple[str, ...] = ()  # one line each, for the submitter (quarantined nodes left out)


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
            job = _queue_slurm(spec, run, dependency, exclude)
            return Queued(job.job_id, held=True, job=job)
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


def _queue_slurm(
    spec: specmod.JobSpec, run: RunFolder, dependency: str | None, exclude: tuple[str, ...]
) -> submitit.Job[str]:
    """submitit's `SlurmExecutor.submit(WorkerCall(run))`, held, with a unique --comment; its
    sbatch through slurmcli.submit. What a failed submission left in submitit/ (its temporary
    script and pickle) is removed."""
    token = f"clusterfsdp:{run.id}:{secrets.token_hex(4)}"
    ex = slurm_executor(spec, run, dependency=dependency, exclude=exclude, token=token)
    before = set(run.submitit_dir.iterdir()) if run.submitit_dir.is_dir() else set()
    try:
        return ex.submit(WorkerCall(str(run.path)))
    except slurmcli.SlurmError as e:
        _remove_new_files(run.submitit_dir, before)
        raise SubmitError(str(e) if e.transient else sbatch_error_line(str(e))) from None
    except OSError as e:
        _remove_new_files(run.submitit_dir, before)
        raise SubmitError(f"submitit could not write {run.submitit_dir}: {e.strerror or e}") from None


def _remove_new_files(folder: Path, before: set[Path]) -> None:
    if folder.is_dir():
        for path in set(folder.iterdir()) - before:
            if path.is_file() or path.is_symlink():
                path.unlink(missing_ok=True)


def sbatch_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if "error" in line.lower()]
    return "sbatch refused the job: " + (lines[-1] if lines else " ".join(text.split())[:300])


def write_call(run: RunFolder, job_id: str) -> Path | None:
    """For a job submitted by hand from `submit --dry-run`'s script: submitit's pickled call at
    `submitit/<job id>_submitted.pkl`, where that script's `_submit` looks (submitit's
    executor writes it for the jobs it queues). None when it is there already (a requeue)."""
    # submitit only when a job is queued (heavy: cloudpickle), not for every Run
    from submitit.helpers import DelayedSubmission

    path = run.submitit_dir / f"{job_id}_submitted.pkl"
    if path.exists():
        return None
    partial = path.with_name(f".{path.name}.partial")
    DelayedSubmission(WorkerCall(str(run.path))).dump(partial)
    os.replace(partial, path)
    return path


def attempt_job(run: RunFolder, attempt: Attempt) -> submitit.Job[str]:
    """submitit's job object of a recorded attempt, for its rank 0 (the task whose result is the
    run's outcome): `result()`, `exception()`, `stdout()`, `paths`. A job submitted by hand from
    `submit --dry-run`'s script keeps its files straight in submitit/."""
    # submitit only when a job is queued (heavy: cloudpickle), not for every Run
    import submitit

    folder = run.submitit_dir / "%j" if (run.submitit_dir / attempt.job_id).is_dir() else run.submitit_dir
    kind = submitit.SlurmJob if attempt.executor is Executor.SLURM else submitit.LocalJob
    return kind(folder=folder, job_id=attempt.job_id, tasks=(0,))


def wait(run: RunFolder, alive: Callable[[Attempt], bool], poll_s: float = 10.0) -> str:
    """Block until the run's newest attempt has ended, following requeues (the same job) and the
    attempts that take over (a follow-up job or an automatic restart is recorded before the job
    that submits it ends); then rank 0's outcome ('completed' or 'stopped') by submitit's
    `job.result()`, which raises submitit's `FailedJobError` (a Python error, with the rank's
    traceback) or `UncompletedJobError` (no result: cancelled, killed, out of restarts).
    `alive` says whether an attempt still runs (the run service passes `backends.still_live`:
    each backend's own liveness, an outage of Slurm waited out)."""
    while True:
        last = run.record().last
        if last is None:
            raise SubmitError(f"run {run.id} has no attempt to wait for")
        while alive(last):
            time.sleep(poll_s)
        newest = run.record().last
        if newest is not None and newest.job_id == last.job_id:
            job = attempt_job(run, last)
            _refuse_foreign_pickle(run, job.paths.result_pickle)
            return job.result()


def _refuse_foreign_pickle(run: RunFolder, pickle_file: Path) -> None:
    """submitit's result file is a pickle, unpickled as whoever waits: never one another user
    could have written (a run planted in a shared run root, or its submitit folder)."""
    problem = runfolder.refusal(run, "wait for")
    found = ownership.path_clause(pickle_file.parent) or ownership.path_clause(pickle_file)
    if problem or found:
        raise SubmitError(problem or f"refusing to read {pickle_file}, a pickle: {found[1] if found else ''}")


def _queue_local(spec: specmod.JobSpec, run: RunFolder) -> Queued:
    """Start submitit's local controller in a new session, so a Ctrl-C in this terminal (e.g.
    while following the log) does not reach the workers, with its stdio on a log file in the
    run folder, so `RUN=$(clusterfsdp submit ...)` or `| tee` return at once instead of holding
    the pipe open for the whole run. The session leader's identity is recorded for cancel."""
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
            # submitit's LocalExecutor whose controller also records each rank's exit status (localctl)
            from ..core import localctl  # submitit (heavy) only when a job is queued, not for every Run

            executor = localctl.RecordingExecutor(
                folder=run.submitit_dir / "%j", run_dir=run.path, max_num_timeout=LOCAL_MAX_TIMEOUTS
            )
            executor.update_parameters(
                tasks_per_node=spec.tasks_per_node,
                timeout_min=spec.time_minutes,
                signal_delay_s=spec.slurm.signal_grace_s,
                gpus_per_node=spec.slurm.gpus_per_node,
            )
            job = executor.submit(WorkerCall(str(run.path)))
            # The group's leader: this process, or a controller a warm launcher forked in a
            # session of its own (core/warmlaunch.py); why it was not, in the log, if one was named
            leader = ProcessId.of(int(job.job_id) if executor.served else os.getpid())
            if executor.cold_because and os.environ.get(warmlaunch.ENV_LAUNCHER):
                print(f"controller started here: {executor.cold_because}", flush=True)
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
