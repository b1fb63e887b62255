"""Where a notebook launch runs: srun inside the kernel's allocation, or local processes, and the
exact srun line and environment for it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..control import launch
from ..core import slurmcli
from ..core import spec as specmod
from ..worker.main import ENV_LOG_ALL_RANKS
from .launcherrors import NotInAllocation, SrunError

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
    cmd += launch.NodeResources.of(s).flags()  # as the sbatch lines of a submitted job say them
    if overlap:
        cmd.append("--overlap")
    task = launch.task_launch(spec)  # [slurm.container]: the image's Python, in the container
    cmd += [*task.srun_args, *srun_args]
    return [*cmd, *task.python, "-u", "-m", "clusterfsdp.notebook.tasks", "_task", str(run_dir)]
