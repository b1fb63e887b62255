"""submitit's `SlurmExecutor`, with its one sbatch call sent through `slurmcli.submit`.

Everything else is submitit's: the batch script (`_make_sbatch_string`, from the parameters
`launch.sbatch_options` gives), the pickled call, the folder layout and the job object. Only how
the script reaches Slurm changes, so that a controller outage is survived as for every other
Slurm command (docs/recovery.md): submitit runs `sbatch FILE` once and fails on the first error;
`slurmcli.submit` retries with backoff, looks the job up by its unique `--comment` before sending
it again (a timed-out sbatch may have queued it), cancels late duplicates, and submits it held.

This needs submitit's private API, which pyproject.toml pins to the minor version the tests run:
`_make_submission_command` (the hook that builds the submission command; here it submits through
slurmcli and hands submitit `echo Submitted batch job N`, the line its parser reads from sbatch),
and `_make_submission_file_text` / `_submitit_command_str` (the script submitit would write, for
`submit --dry-run` and the TUI). Imported only when a Slurm attempt is queued or rendered:
submitit's import costs about 0.1 s.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import DelayedSubmission, JobPaths

from ..core import slurmcli


class RetriedSlurmExecutor(submitit.SlurmExecutor):
    """A `submitit.SlurmExecutor` whose sbatch is `slurmcli.submit(file, token, comment)`.

    `token`: the unique part of the job's `--comment` (also in the script's `comment` parameter,
    so the submitted file says everything); `hold`: submitted held (`--hold`, also a parameter),
    released by `launch.start` once the run service recorded the attempt. submitit never
    requeues on its own (`max_num_timeout=0`, and `launch.WorkerCall` puts the signals back to
    the worker's handlers): the worker decides."""

    def __init__(self, folder: Path, python: str, token: str = "", comment: str = "", hold: bool = True):
        super().__init__(folder, max_num_timeout=0, python=python)
        self.token, self.comment, self.hold = token, comment, hold

    @classmethod
    def affinity(cls) -> int:
        """Rendering a script needs no srun on this host (the TUI shows it on a laptop); queueing
        needs sbatch, which slurmcli reports missing in one line."""
        return 2

    def _make_submission_command(self, submission_file_path: Path) -> list[str]:
        if not self.token:
            raise RuntimeError("a script rendered for `submit --dry-run` is not submitted by clusterfsdp")
        job_id = slurmcli.submit(submission_file_path, self.token, self.comment, hold=self.hold)
        return ["echo", f"Submitted batch job {job_id}"]

    def submit_array(self, calls: list[Callable[[], Any]], scratch: Path) -> list[str]:
        """Several calls as one job array (the parameters have `map_count`): submitit's own array
        path (`_internal_process_submissions`) submits through a plain `SlurmExecutor` and
        cannot format a folder with `%a`, so it is done here the same way: the calls pickled,
        the script sent once through slurmcli (held), each pickle moved to its task's folder
        (`<job id>_<i>_submitted.pkl`, where the task's `_submit` looks). The tasks' job ids."""
        scratch.mkdir(parents=True, exist_ok=True)
        tag = uuid.uuid4().hex
        script = scratch / f".submission_{tag}.sh"
        pickles = [scratch / f".{tag}_{i}.pkl" for i in range(len(calls))]
        try:
            for call, path in zip(calls, pickles, strict=True):
                delayed = DelayedSubmission(call)
                delayed.set_timeout(self.parameters.get("time", 5), self.max_num_timeout)
                delayed.dump(path)
            script.write_text(self.script())
            job_id = slurmcli.submit(script, self.token, self.comment, hold=self.hold)
        except BaseException:
            for path in [script, *pickles]:
                path.unlink(missing_ok=True)
            raise
        os.replace(script, scratch / f"{job_id}_submission.sh")
        ids = [f"{job_id}_{i}" for i in range(len(calls))]
        for task, path in zip(ids, pickles, strict=True):
            paths = JobPaths(self.folder, job_id=task)
            paths.folder.mkdir(parents=True, exist_ok=True)
            os.replace(path, paths.submitted_pickle)
        return ids

    def script(self) -> str:
        """The batch script this executor writes for a submission (submitit's own text)."""
        return self._make_submission_file_text(self._submitit_command_str, "")


def executor(folder: Path, python: str, parameters: dict[str, Any], **kwargs: Any) -> RetriedSlurmExecutor:
    ex = RetriedSlurmExecutor(folder, python, **kwargs)
    ex.update_parameters(**parameters)
    return ex
