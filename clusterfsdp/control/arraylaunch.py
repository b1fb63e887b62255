"""A sweep's points queued as ONE Slurm job array (`--array=0-K%N`), through the same submitit
executor and job steps as a single run's attempt (`control.launch`): task i's job steps and
worker find point i's run folder `<prefix><i>` by $SLURM_ARRAY_TASK_ID, and its attempt's job id
is `<array id>_<i>` (`slurmcli.batch_job_id`). The sweep service (`control.sweep`) records the
points' attempts before the array is released.
"""

from __future__ import annotations

import secrets
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from ..core import slurmcli
from ..core import spec as specmod
from ..core.runfolder import RunFolder
from . import launch, noderecord

if TYPE_CHECKING:
    from .slurmexec import RetriedSlurmExecutor


def array_executor(
    spec: specmod.JobSpec, prefix: Path, count: int, parallel: int, token: str, exclude: tuple[str, ...] = ()
) -> RetriedSlurmExecutor:
    """submitit's `SlurmExecutor` for a sweep's job array (`--array=0-K%N`): task i runs the point
    whose run folder is `<prefix><i>` (the job steps pick it by $SLURM_ARRAY_TASK_ID; submitit's
    files land in that run folder's `submitit/<array id>_<i>/`, as for a single run's job)."""
    steps = launch.job_steps_for(f"sweep {prefix.parent.name}", f'RUN={shlex.quote(str(prefix))}"$SLURM_ARRAY_TASK_ID"')
    parameters = launch.sbatch_options(spec, exclude=exclude, token=token, hold=True)
    parameters.update(array_parallelism=parallel or count)
    ex = launch.executor_for(spec, prefix.parent / f"{prefix.name}%a" / "submitit" / "%j", steps, parameters, token)
    ex.parameters["map_count"] = count  # submitit's internal parameter (not `update_parameters`'), as it sets it
    return ex


def queue_array(
    specs: list[specmod.JobSpec], runs: list[RunFolder], prefix: Path, parallel: int
) -> list[launch.Queued]:
    """Queue a sweep's points as one held Slurm job array (task i: `runs[i]`, at `<prefix><i>`);
    their attempts' job ids are `<array id>_<i>`. One set of sbatch options for every point: a
    sweep that varies them is refused (`array_refusal`) before any folder is made."""
    token = f"clusterfsdp:{prefix.parent.name}:{secrets.token_hex(4)}"
    scratch = prefix.parent / "submitit"
    with launch.submission_env(specs[0]):
        quarantined, _ = noderecord.plan(specs[0])  # (the nodes left out are named in the batch script)
        ex = array_executor(specs[0], prefix, len(runs), parallel, token, quarantined)
        try:
            ids = ex.submit_array([launch.WorkerCall(str(r.path)) for r in runs], scratch)
        except slurmcli.SlurmError as e:
            raise launch.SubmitError(str(e) if e.transient else launch.sbatch_error_line(str(e))) from None
        except OSError as e:
            raise launch.SubmitError(f"submitit could not write {scratch}: {e.strerror or e}") from None
    return [launch.Queued(job_id, held=True) for job_id in ids]


def array_refusal(specs: list[specmod.JobSpec]) -> str | None:
    """Why the points cannot share one job array (their sbatch options or setup lines differ)."""
    first = (launch.sbatch_options(specs[0]), specs[0].slurm.setup, launch.task_launch(specs[0]))
    for i, spec in enumerate(specs[1:], 1):
        if (launch.sbatch_options(spec), spec.slurm.setup, launch.task_launch(spec)) != first:
            return (
                f"point {i} needs other Slurm options than point 0 (a slurm.* key varies); one job array has "
                "one set: sweep it with --executor local, or run separate sweeps"
            )
    return None
