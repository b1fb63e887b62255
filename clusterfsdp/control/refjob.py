"""The reference pass of a preference run as a Slurm job of its own (issue 37).

dpo and ipo without LoRA compare the policy with a frozen reference's log-probs of every train
and eval pair (worker/preference.py). With `train.preference.reference_pass` 'job' (or 'auto',
the default, on Slurm) `submit` queues that pass first: one submitit job on the training job's
nodes, tasks, GPUs, container and setup lines, named `<job.name>-reference`, after the data
prepare array when one was queued (control/prepjob.py). Its ranks build the reference sharded
like the policy (worker/reference.py; no optimizer), compute the tables and rank 0 writes them
where the training attempt reads them (<checkpoints>/reference/{train,eval}.npz). The training
job waits for it with `--dependency=afterok:...` and `--kill-on-invalid-dep=yes`: if the pass
fails Slurm cancels the training job, and `status` and `doctor` say why from RECORD (the job
id) and Slurm's word on it, with the last error line of its rank 0.

The control plane never imports the worker: `ReferenceCall` names it as a module, like
launch.WorkerCall.
"""

from __future__ import annotations

import importlib
import json
import re
import secrets
import shlex
import signal
from pathlib import Path

from ..core import fileio, slurmcli
from ..core import spec as specmod
from ..core.errors import UserError
from ..core.records import RunState
from ..core.runfolder import RunFolder
from ..core.spec.objective import reference_job, reference_table
from ..core.value import value
from . import launch

RECORD = "reference.json"  # in a run folder: the reference job its training job waits for
FOLDER = "reference"  # in a run folder: the reference job's submitit files and logs


class ReferenceJobError(UserError, RuntimeError):
    """The reference job could not be queued, or is not possible here; one line for the user."""


@value(frozen=True)
class ReferenceCall:
    """What submitit pickles and every rank of the reference job calls:
    `clusterfsdp.worker.reference.run(run_dir)`, imported by name. Slurm's stop signals end the
    rank at once (submitit's own handlers would requeue it): a pass cut off is simply rerun by
    the next submit."""

    run_dir: str

    def __call__(self) -> str:
        for sig in (signal.SIGUSR2, signal.SIGTERM, signal.SIGCONT):
            signal.signal(sig, signal.SIG_DFL)
        return importlib.import_module("clusterfsdp.worker.reference").run(self.run_dir)


def check(spec: specmod.JobSpec, where: str) -> None:
    """reference_pass = 'job' needs a Slurm batch submission of one run (`where` 'slurm'): the
    local executor, a notebook's srun step (`where`: the executor), a sweep's points ('sweep',
    which compute it in their training job) and a dry run ('dry run', one script) cannot wait
    for another job; refused before anything is made."""
    if where == "slurm" or not (reference_table(spec) and spec.train.preference.reference_pass == "job"):
        return
    because = {
        "sweep": "is not queued for a sweep's points (each computes its reference in its training job)",
        "dry run": "is a Slurm job of its own, which `submit --dry-run` does not write",
    }.get(where, f"is a Slurm job of its own and this run uses the {where} executor")
    how = ", or submit with --executor slurm" if where in ("local", "srun") else ""
    raise ReferenceJobError(f"train.preference.reference_pass: 'job' {because}; set it to 'in_job' (or 'auto'){how}")


def before_training(spec: specmod.JobSpec, run: RunFolder, *, slurm: bool, after: str | None) -> str | None:
    """Before the first attempt is queued: queue the reference job where the run has one
    (objective.reference_job), after `after` (the prepare array's `afterok:N`), record it in the
    run folder and return the training job's dependency on both; else `after` unchanged."""
    if not reference_job(spec, slurm):
        return after
    job_id = queue(spec, run, after)
    fileio.atomic_write(run.path / RECORD, json.dumps({"job_id": job_id}))
    return f"{after}:{job_id}" if after else f"afterok:{job_id}"


def queue(spec: specmod.JobSpec, run: RunFolder, dependency: str | None) -> str:
    """Queue the reference job (submitit files under <run>/reference/<job id>/): the training
    job's sbatch options (launch.sbatch_options: nodes, tasks, GPUs, container, quoting) with
    its own name and partition, no requeue and no --no-kill (a lost node fails the pass; the
    training job then never starts). Submitted held until submitit made its log folder."""
    from . import slurmexec  # submitit (with cloudpickle): only when a job is queued

    token = f"clusterfsdp:{run.id}:reference:{secrets.token_hex(4)}"
    parameters = launch.sbatch_options(spec, dependency, token=token)
    parameters["job_name"] = f"{spec.job.name}-reference"
    partition = spec.train.preference.reference_partition or spec.slurm.partition
    if partition:
        parameters["partition"] = partition
    extra = parameters["additional_parameters"]
    for key in ("no-kill", "requeue", "no-requeue"):
        extra.pop(key, None)
    extra["no-requeue"] = True
    parameters["setup"] = list(spec.slurm.setup)
    python = shlex.join(launch.task_launch(spec).python)
    folder = run.path / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    comment = str(spec.slurm.extra.get("comment", ""))
    ex = slurmexec.executor(folder / "%j", python, parameters, token=token, comment=comment)
    try:
        with launch.submission_env(spec):
            job_id = str(ex.submit(ReferenceCall(str(run.path))).job_id)
    except slurmcli.SlurmError as e:
        raise ReferenceJobError(f"{launch.sbatch_error_line(str(e))} (the reference job, queued first)") from None
    try:
        slurmcli.release(job_id)
    except slurmcli.SlurmError as e:
        abandon_job(job_id)
        raise ReferenceJobError(f"reference job {job_id} could not be released ({e}); cancelled") from None
    return job_id


def abandon_job(job_id: str) -> None:
    """scancel, best effort (a job that already ended is no error here)."""
    try:
        slurmcli.scancel(job_id)
    except slurmcli.SlurmError:
        pass


def abandon(run: RunFolder) -> bool:
    """Cancel the reference job of a run whose training job could not be queued or was
    cancelled (best effort); whether one was still queued or running."""
    job_id = recorded(run.path)
    if job_id is None:
        return False
    try:
        live = RunState.parse(slurmcli.job_states([job_id])[job_id].state).live
    except (slurmcli.SlurmError, KeyError):
        live = True  # not known: cancelled all the same
    if live:
        abandon_job(job_id)
    return live


def recorded(run_path: Path) -> str | None:
    """The reference job a run's training job waits for (RECORD), or None."""
    try:
        return str(fileio.load_json(run_path / RECORD)["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def last_error(run_path: Path, job_id: str) -> str:
    """The last exception line of the reference job's rank 0 (its submitit stderr), or ''."""
    log = run_path / FOLDER / job_id / f"{job_id}_0_log.err"
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    # (torch's excepthook prints the traceback again, each line prefixed `[rank0]: `)
    found = [
        m[1] for x in lines if (m := re.match(r"^(?:\[rank\d+\]:)?\s*([A-Za-z_.]*(?:Error|Exception)\b.*: .*)", x))
    ]
    return found[-1].strip()[:300] if found else ""


def note(run_path: Path, live: bool) -> str | None:
    """What `status` says about the reference job of a run whose training job has not started:
    while the training job waits, the reference job's state; once it ended without starting,
    how the reference job ended (and its rank 0's error). None when it completed or is unknown."""
    job_id = recorded(run_path)
    if job_id is None:
        return None
    try:
        row = slurmcli.job_states([job_id]).get(job_id)
    except slurmcli.SlurmError:
        return None
    if row is None:
        return f"waiting for reference job {job_id}" if live else None
    state = RunState.parse(row.state)
    if state is RunState.COMPLETED:
        return None
    if state.live:
        return f"waiting for reference job {job_id} ({row.state}): the reference log-probs of the pairs"
    why = last_error(run_path, job_id)
    where = run_path / FOLDER / job_id
    return (
        f"reference job {job_id} {row.state.split()[0]}" + (f": {why}" if why else "") + f" (logs in {where}); "
        "the training job never started; fix it and submit again"
    )
