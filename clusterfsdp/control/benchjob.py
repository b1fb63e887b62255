"""A benchmark evaluation as a Slurm job of its own (issue 38): queued through submitit by rank 0
of a training job when a checkpoint is complete (worker/benchqueue.py), on benchmarks.partition
with benchmarks.gpus and benchmarks.time. Its batch step runs `benchrun.evaluate` on the run folder
(export, then lm-eval), so it needs nothing from the training job, which never waits for it.
Jobs of one run share a name and `--dependency=singleton`: Slurm runs them one at a time, in the
order they were queued, however many checkpoints arrive while the partition is busy.

Rank 0 queues it across a process boundary (the worker stands below the run service):

    python -m clusterfsdp.control.benchjob RUN_DIR STEP     # prints the job id
"""

from __future__ import annotations

import secrets
import shlex
import sys
from pathlib import Path

from ..core import slurmcli
from ..core.benchresults import results_dir
from ..core.errors import UserError
from ..core.runfolder import RunFolder
from ..core.spec import JobSpec, parse_time_minutes
from ..core.value import value
from . import benchrun, launch, slurmexec
from .run import Run, RunError


@value(frozen=True)
class BenchCall:
    """What submitit pickles: evaluate checkpoint `step` of the run at `run_path`. A failure is
    recorded (benchmarks/step-N.failed.json) and ends the job with exit status 1."""

    run_path: str
    step: int

    def __call__(self) -> None:
        try:
            document = benchrun.evaluate_once(
                Run(self.run_path), self.step, lambda line: print(line, flush=True), again=False
            )
            print(benchrun.describe(self.step, document), flush=True)
        except RunError as e:
            sys.exit(f"error: {e}")


def job_name(run: RunFolder) -> str:
    """One name per run: `--dependency=singleton` orders that run's evaluations."""
    return f"bench-{run.id}"


def queue(run: RunFolder, spec: JobSpec, step: int) -> str:
    """Queue the evaluation of checkpoint `step`; its job id (slurmcli.SlurmError when sbatch refuses)."""
    b, s = spec.benchmarks, spec.slurm
    parameters = {
        "job_name": job_name(run),
        "nodes": 1,
        "ntasks_per_node": 1,
        "time": parse_time_minutes(b.time),
        "partition": b.partition or s.partition or None,
        "account": s.account or None,
        "qos": s.qos or None,
        "gpus_per_node": b.gpus or None,
        "wckey": None,  # submitit's default "submitit" is refused where wckeys are enforced
        "setup": list(s.setup),
        "use_srun": s.container.kind != "none",
        "srun_args": list(launch.task_launch(spec).srun_args),
        "additional_parameters": {"dependency": "singleton"},
    }
    folder = results_dir(run) / "slurm"
    folder.mkdir(parents=True, exist_ok=True)
    ex = slurmexec.executor(
        folder / "%j",
        shlex.join(launch.task_launch(spec).python),
        {k: v for k, v in parameters.items() if v is not None or k == "wckey"},
        token=f"clusterfsdp:bench:{secrets.token_hex(4)}",
        hold=False,
    )
    with launch.submission_env(spec):
        job = ex.submit(BenchCall(str(run.path), step))
    return str(job.job_id)


def main(argv: list[str]) -> int:
    """Queue the evaluation of step argv[1] of the run at argv[0]; print its job id (or the error, exit 1)."""
    if len(argv) != 2 or not argv[1].isdigit():
        print("usage: python -m clusterfsdp.control.benchjob RUN_DIR STEP", file=sys.stderr)
        return 2
    run = RunFolder(Path(argv[0]))
    try:
        print(queue(run, run.spec(), int(argv[1])), flush=True)
    except (slurmcli.SlurmError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
