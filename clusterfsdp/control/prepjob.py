"""Tokenizing a job's data as a Slurm job array of its own, so that no GPU waits on it.

`clusterfsdp data prepare JOB --executor slurm` and `submit` of a job whose data is not prepared
(`data.prepare = 'job'`, the default on Slurm) queue one job array through submitit's
`map_array` (`slurmexec.RetriedSlurmExecutor`: sbatch retried through a controller outage, a
unique `--comment`). Each task tokenizes its share of the units into the dataset's partial
folder in the shared cache; the last one to finish renames it into place (data/array.py). The
training job waits for it with `--dependency=afterok:<array>` and `--kill-on-invalid-dep=yes`:
a failed array (bad input, a task killed) leaves the training job cancelled by Slurm, and
`status` gives the reason from the cache (`note`). Torch-free: the tasks import the data side by
name (`PrepareCall`), as `launch.WorkerCall` imports the worker.

Sizing: one task per node of the job (or `--nodes N`: N tasks of a whole node each, or
`--array-size K` tasks of `--cpus-per-task C` CPUs), each with a process per CPU it was given;
docs/data.md says how to choose.
"""

from __future__ import annotations

import importlib
import json
import os
import secrets
import shlex
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..core import fileio, ownership, slurmcli
from ..core import spec as specmod
from ..core.errors import UserError
from ..core.fileio import atomic_write
from ..core.records import RunState
from ..core.runfolder import RunFolder
from ..core.value import value
from ..data import arraystate
from ..data.cache import DatasetRef, cache_root, dataset_refs
from ..data.checks import container_only_paths
from ..data.sources import DataError
from . import launch

RECORD = "prepare.json"  # in a run folder: the array its training job waits for
HASH_BYTES = 1 << 30  # of sources the login node hashes to tell whether the data is prepared


class PrepareError(UserError, RuntimeError):
    """The prepare array could not be queued, or failed; one line for the user."""


@value(frozen=True)
class ArrayOptions:
    """How the array is sized: `nodes` tasks that each take a whole node, or `tasks` tasks of
    `cpus_per_task` CPUs (0 for both: one task per node of the job, whole nodes)."""

    nodes: int = 0
    tasks: int = 0
    partition: str = ""
    cpus_per_task: int = 0
    time_minutes: int = 0

    def count(self, spec: specmod.JobSpec) -> int:
        return self.nodes or self.tasks or spec.node_range.low

    def whole_nodes(self) -> bool:
        return not self.tasks


@value(frozen=True)
class PrepareCall:
    """What submitit pickles for the array; task `index` runs `data.prepare.run_task` on the
    resolved job (secrets redacted: tokenizing needs none). Slurm's stop signals (scancel, the
    time limit) end the task at once, releasing its unit claims; complete units are kept."""

    job_toml: str
    count: int

    def __call__(self, index: int) -> bool:
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
        array = importlib.import_module("clusterfsdp.data.array")
        prepare = importlib.import_module("clusterfsdp.data.prepare")
        spec = specmod.loads(self.job_toml)
        # (submitit queues a single task as a plain job, without SLURM_ARRAY_JOB_ID)
        job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID") or f"pid{os.getpid()}"
        share = array.Share(index, self.count, job)
        try:
            return prepare.run_task(spec, share, lambda line: print(line, flush=True))
        except DataError as e:
            sys.exit(f"error: {e}")  # recorded in the partial folder (failed.json) for status


def missing(spec: specmod.JobSpec) -> list[DatasetRef]:
    """The job's datasets that are not prepared, or that cannot be told without hashing more than
    HASH_BYTES of sources not fingerprinted yet here (their key is None: the array's tasks hash
    them, and find them prepared if they are)."""
    if spec.data.source != "files":
        return []
    try:
        return [ref for ref in dataset_refs(spec, budget=HASH_BYTES) if ref.manifest() is None]
    except DataError as e:
        raise PrepareError(str(e)) from None


def queue(spec: specmod.JobSpec, options: ArrayOptions, refs: list[DatasetRef], folder: Path, run_dir: str = "") -> str:
    """Queue the prepare array of `refs` (submitit files under `folder`); its job id."""
    from . import slurmexec  # submitit (with cloudpickle): only when a job is queued

    count = options.count(spec)
    s = spec.slurm
    parameters = {
        "job_name": f"{spec.job.name}-prepare",
        "nodes": 1,
        "ntasks_per_node": 1,
        "time": options.time_minutes or spec.time_minutes,
        "cpus_per_task": options.cpus_per_task or None,
        "partition": options.partition or spec.data.prepare_partition or s.partition or None,
        "account": s.account or None,
        "qos": s.qos or None,
        "exclusive": True if options.whole_nodes() else None,
        "array_parallelism": count,
        "wckey": None,  # submitit's default "submitit" is refused where wckeys are enforced
        "setup": list(s.setup),
        # The batch step itself runs the task, with every CPU of its allocation: an srun step gets
        # one CPU unless it asks for more (Slurm >= 20.11). A container needs srun to start it.
        "use_srun": s.container.kind != "none",
        "srun_args": list(launch.task_launch(spec).srun_args),
    }
    token = f"clusterfsdp:prepare:{secrets.token_hex(4)}"
    python = shlex.join(launch.task_launch(spec).python)
    ex = slurmexec.executor(
        folder / "%j",
        python,
        {k: v for k, v in parameters.items() if v is not None or k == "wckey"},
        token=token,
        hold=False,
    )
    call = PrepareCall(specmod.dumps(spec, redact=True), count)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        with launch.submission_env(spec):
            jobs = ex.map_array(call, list(range(count)))
    except slurmcli.SlurmError as e:
        raise PrepareError(f"{launch.sbatch_error_line(str(e))} (the data prepare array, queued first)") from None
    job_id = str(jobs[0].job_id).split("_")[0]  # 'N_0' of an array ('N' for one task: a plain job)
    for ref in refs:
        if ref.key is not None:
            arraystate.record_array(ref, job_id, count, run_dir)
    return job_id


# ---------------------------------------------------------------- submit
def before_training(spec: specmod.JobSpec, run: RunFolder, *, slurm: bool) -> str | None:
    """Before the first attempt is queued: with `data.prepare = 'job'` on Slurm, queue the prepare
    array for the data that is not prepared, record it in the run folder and return the training
    job's dependency; with 'require', refuse (any executor). None when nothing is missing or the
    job prepares its data itself (in_job, the local executor, data only inside a container)."""
    d = spec.data
    if d.source != "files" or d.prepare == "in_job" or (d.prepare == "job" and not slurm) or container_only_paths(spec):
        return None
    refs = missing(spec)
    if not refs:
        return None
    if d.prepare == "require":
        roles = " and ".join(r.role for r in refs)
        raise PrepareError(
            f"data.prepare = 'require': the {roles} data is not prepared; run `clusterfsdp data prepare` first"
        )
    job_id = queue(spec, ArrayOptions(), refs, run.path / "prepare", str(run.path))
    record = {
        "job_id": job_id,
        "datasets": [
            {"role": r.role, "key": r.key, "root": str(r.root), "bytes": sum(s.size() for s in r.sources)} for r in refs
        ],
    }
    atomic_write(run.path / RECORD, json.dumps(record))
    return f"afterok:{job_id}"


def abandon(run: RunFolder) -> None:
    """Cancel the prepare array of a run whose training job could not be queued (best effort)."""
    try:
        job_id = str(fileio.load_json(run.path / RECORD)["job_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        slurmcli.scancel(job_id)
    except slurmcli.SlurmError:
        pass


def recorded(run_path: Path) -> tuple[str, list[arraystate.PrepareProgress]] | None:
    """The prepare array a run's training job waits for, with each dataset's progress."""
    try:
        record = fileio.load_json(run_path / RECORD)
        datasets = [(DatasetRef(d["role"], (), d["key"], Path(d["root"])), int(d["bytes"])) for d in record["datasets"]]
        return str(record["job_id"]), [arraystate.progress(ref, total) for ref, total in datasets]
    except (OSError, ValueError, KeyError, TypeError, DataError):
        return None


def note(run_path: Path, live: bool) -> str | None:
    """What `status` says about the prepare array of a run's training job: while it waits, the
    progress; once it was cancelled, why (bad input with file and line, or a task that died)."""
    found = recorded(run_path)
    if found is None:
        return None
    job_id, progress = found
    if all(p.phase is arraystate.PreparePhase.PREPARED for p in progress):
        return None
    if live:
        return f"waiting for data prepare job {job_id}: " + "; ".join(p.line() for p in progress)
    failed = [p for p in progress if p.phase is arraystate.PreparePhase.FAILED]
    if failed:
        return f"data prepare job {job_id} failed: {failed[0].error}"
    return (
        f"data prepare job {job_id} ended before the data was complete (a task died?): "
        f"{'; '.join(p.line() for p in progress)}; `clusterfsdp data prepare` continues it"
    )


# ---------------------------------------------------------------- watching
def array_live(job_id: str) -> bool:
    """Whether any task of the array is still queued or running (True when Slurm does not answer)."""
    try:
        out = slurmcli.run(["squeue", "-h", "-r", "-j", job_id, "-o", "%T"], timeout=30)
    except slurmcli.SlurmError as e:
        return "Invalid job id" not in str(e)
    return any(RunState.parse(state.strip()).live for state in out.splitlines() if state.strip())


def status_lines(spec: specmod.JobSpec) -> list[str]:
    """`clusterfsdp data status`: each dataset's state, from the cache (and Slurm for its array)."""
    lines = []
    for ref in dataset_refs(spec, budget=HASH_BYTES) if spec.data.source == "files" else []:
        if ref.key is None:
            lines.append(f"{ref.role}: not looked up (over {HASH_BYTES >> 20} MB of sources not fingerprinted yet)")
            continue
        p = arraystate.progress(ref)
        lines.append(p.line())
        if p.array and p.phase is not arraystate.PreparePhase.PREPARED:
            live = array_live(str(p.array["job_id"]))
            lines.append(f"{ref.role}: array job {p.array['job_id']} {'is queued or running' if live else 'has ended'}")
    return lines or ["data.source = 'synthetic': nothing to prepare"]


def follow(spec: specmod.JobSpec, job_id: str, out: Callable[[str], None] = print, poll_s: float = 2.0) -> int:
    """Print progress until the array ends: 0 when the data is prepared, 1 otherwise."""
    last = ""
    while True:
        live = array_live(job_id)
        # (looked up again each time: the tasks fingerprint sources this host could not afford to)
        progress = [arraystate.progress(ref) for ref in dataset_refs(spec, budget=HASH_BYTES)]
        text = "; ".join(p.line() for p in progress)
        if text != last:
            out(text)
            last = text
        if all(p.phase is arraystate.PreparePhase.PREPARED for p in progress):
            return 0
        failed = [p for p in progress if p.phase is arraystate.PreparePhase.FAILED]
        if failed or not live:
            why = failed[0].error if failed else "the array ended before the data was complete"
            out(f"error: data prepare job {job_id}: {why}")
            return 1
        time.sleep(poll_s)


def cache_folder(spec: specmod.JobSpec) -> Path:
    """Where a standalone prepare array keeps its submitit files: pickles its tasks run, so a
    folder of this user's only (another user who made `.prepare-jobs` first could swap them)."""
    return ownership.private_folder(cache_root(spec) / ".prepare-jobs")
