"""submitit's local controller, plus a record of how each task ended.

A rank that dies without an exception (SIGKILL, the OOM killer, a segfault) leaves no record of
its own, and on the local executor nothing else knew its exit status: submitit's controller
waits for its tasks and throws the statuses away. This controller is submitit's
(`submitit.local.local.Controller`, everything it does kept) and writes them, one list per round
of tasks (a round per restart on exit code 144), to `<job folder>/<job id>_exit_codes.json`:

    [[1, -9]]        rank 0 exited 1, rank 1 died of signal 9 (SIGKILL), in the first round

so that `doctor` and `status` name the signal (core/evidence.py). Slurm's srun reports the
same through its exit status, which the batch script's job step records (control/jobstep.py).

`RecordingExecutor` is submitit's LocalExecutor with this controller instead of submitit's own; its
environment is the one submitit's `start_controller` gives (submitit 1.5.x, pinned). Given the run
folder, it starts this controller warm (`clusterfsdp.worker.warmctl`, issue 36): the job's
controller process imports torch and transformers once and forks the ranks from itself, so the
control plane that queues the job imports neither. When a warm launcher of this user is named
(`CLUSTERFSDP_LAUNCHER`, core/warmlaunch.py), the controller itself is forked by it, in a session
of its own, and started here only when it is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

import submitit
from submitit.core import utils
from submitit.local import local

from . import warmlaunch
from .evidence import EXIT_CODES


class Controller(local.Controller):
    """submitit's controller; each round's exit statuses are appended to the job's record."""

    def job_folder(self) -> Path:
        """This job's folder, named by this process's pid. The submitting process makes it when it
        moves the job's pickle there, once it has the pid; a controller that reaches its tasks
        sooner (forked by a warm launcher, core/warmlaunch.py, with nothing left to import) makes
        it first, or opening the tasks' log files there fails: a crossproduct draw never started
        on a loaded machine (issue 36, run 41). The tasks wait for the pickle themselves."""
        return utils.JobPaths(self.folder, self.pid, 0).folder

    def start_tasks(self) -> None:
        self.job_folder().mkdir(parents=True, exist_ok=True)
        super().start_tasks()

    def wait(self, freq: int = 24) -> tp.Sequence[int | None]:
        codes = super().wait(freq)
        path = self.job_folder() / EXIT_CODES.format(job_id=self.pid)
        try:
            rounds = json.loads(path.read_text()) if path.is_file() else []
        except (OSError, ValueError):
            rounds = []
        rounds.append(list(codes))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(rounds))
        os.replace(tmp, path)
        return codes


# The warm controller: this module's, in the worker (it imports torch); started by name.
WARM_CONTROLLER = "clusterfsdp.worker.warmctl"


class RecordingExecutor(submitit.LocalExecutor):
    """submitit's LocalExecutor, started with this module's controller (warm, given `run_dir`)."""

    def __init__(self, folder: str | Path, *, run_dir: str | Path | None = None, **kwargs: tp.Any):
        super().__init__(folder, **kwargs)
        self.run_dir = run_dir
        # Whether a warm launcher (core/warmlaunch.py) started the controller, in a session of its
        # own: then the controller, not the submitting process, leads the attempt's process group.
        self.served = False
        self.cold_because = ""

    def _submit_command(self, command: str) -> submitit.LocalJob:
        ntasks = self.parameters.get("tasks_per_node", 1)
        env = {
            **os.environ,
            "SUBMITIT_LOCAL_NTASKS": str(ntasks),
            "SUBMITIT_LOCAL_COMMAND": command,
            "SUBMITIT_LOCAL_TIMEOUT_S": str(int(60 * self.parameters.get("timeout_min", 2.0))),
            "SUBMITIT_LOCAL_SIGNAL_DELAY_S": str(int(self.parameters.get("signal_delay_s", 30))),
            "SUBMITIT_LOCAL_NODEID": "0",
            "SUBMITIT_LOCAL_JOB_NUM_NODES": "1",
            "SUBMITIT_STDERR_TO_STDOUT": "",
            "SUBMITIT_EXECUTOR": "local",
            "CUDA_VISIBLE_DEVICES": ",".join(str(k) for k in range(self.parameters.get("gpus_per_node", 0))),
            "SUBMITIT_LOCAL_WITH_SHELL": "",
        }
        controller = [sys.executable, "-m", "clusterfsdp.core.localctl", str(self.folder)]
        tasks = list(range(ntasks))
        if self.run_dir is not None:
            controller = [sys.executable, "-m", WARM_CONTROLLER, str(self.folder), str(self.run_dir)]
            pid, self.cold_because = warmlaunch.start(controller, env)
            if pid is not None:  # forked by a warm launcher, leading a session of its own
                self.served = True
                return submitit.LocalJob(folder=self.folder, job_id=str(pid), tasks=tasks)
        process = subprocess.Popen(controller, env=env)
        return submitit.LocalJob(folder=self.folder, job_id=str(process.pid), process=process, tasks=tasks)


if __name__ == "__main__":
    Controller(Path(sys.argv[1])).run()
