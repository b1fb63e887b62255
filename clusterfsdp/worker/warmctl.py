"""The local executor's controller, warm (issue 36): `python -m clusterfsdp.worker.warmctl
SUBMITIT_FOLDER RUN_DIR`, what `core.localctl.RecordingExecutor` starts for a run.

It is `core.localctl.Controller` (submitit's local controller, which dispatches every round of
tasks and restarts them on exit code 144, plus the record of each rank's exit status), with the
imports of torch, transformers and the worker done once here, in the job's controller process
(never in the CLI, which stays torch-free), and each task forked from it (`worker.warmstart`)
instead of started as a fresh interpreter. Everything else is submitit's: the tasks' log files in
the job folder, their environment (`SUBMITIT_LOCAL_*`), the timeout signal, the stop of all tasks
when one ends, and this process group, which cancel signals as before.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from submitit.core import utils

from ..core import localctl
from . import warmstart


class Controller(localctl.Controller):
    def __init__(self, folder: Path, run_dir: str):
        # Before submitit's handler is installed: a cancel (SIGTERM to the group) during the
        # imports ends this process with no rank started, as it ends a cold rank in its imports.
        self.launcher = warmstart.Launcher()
        print(f"clusterfsdp local controller {os.getpid()}: {self.launcher.preload(run_dir)}", flush=True)
        super().__init__(folder)

    def start_tasks(self) -> None:
        """submitit's `start_tasks` (1.5.x), each task started by the warm launcher, in the job
        folder made here if the submitting process has not made it yet (`job_folder`)."""
        self.job_folder().mkdir(parents=True, exist_ok=True)
        self.folder.mkdir(exist_ok=True)
        paths = [utils.JobPaths(self.folder, self.pid, k) for k in range(self.ntasks)]
        self.stdouts = [p.stdout.open("a") for p in paths]
        self.stderrs = self.stdouts if self.stderr_to_stdout else [p.stderr.open("a") for p in paths]
        for k in range(self.ntasks):
            env = dict(os.environ, SUBMITIT_LOCAL_LOCALID=str(k), SUBMITIT_LOCAL_GLOBALID=str(k))
            env["SUBMITIT_LOCAL_JOB_ID"] = self.pid
            try:
                task = self.launcher.start(self.command, env, stdout=self.stdouts[k], stderr=self.stderrs[k])
            except warmstart.BecomeRank:  # this process is task k now: nothing of the controller's to stop
                self.tasks, self.stdouts, self.stderrs = [], [], []
                raise
            self.tasks.append(task)  # type: ignore[arg-type]  (a Popen or a warmstart.Forked: poll, send_signal)


def main(argv: list[str]) -> None:
    Controller(Path(argv[0]), argv[1]).run()


if __name__ == "__main__":
    sys.exit(warmstart.run_main(main, sys.argv[1:]))
