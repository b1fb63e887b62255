"""The notebook launcher's user-facing errors: IPython shows their messages without a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..core.errors import UserError

if TYPE_CHECKING:
    from .result import SrunResult


class NotebookError(UserError, RuntimeError):
    """A user-facing launch error; IPython shows the message without a traceback (as for every
    `UserError`: a bad job file, a refused submission)."""


class NotInAllocation(NotebookError):
    """`srun` was asked for outside a Slurm allocation."""


class SrunError(NotebookError):
    """srun (or the local launcher) could not start the job."""


class StepInterrupted(KeyboardInterrupt):
    """Raised after the stop button (KeyboardInterrupt) cancelled the step; `.result` has what was done.

    A KeyboardInterrupt, so "Run All" stops here as it does for any interrupted cell; IPython
    shows only the message."""

    def __init__(self, message: str, result: SrunResult):
        super().__init__(message)
        self.result = result

    def _render_traceback_(self) -> list[str]:
        return [f"StepInterrupted: {self.args[0]}", "(the result so far: clusterfsdp.notebook.last_result())"]


class StepFailed(NotebookError):
    """Raised with `check=True` when a rank failed; `.result` has the exit status per rank."""

    def __init__(self, message: str, result: SrunResult):
        super().__init__(message)
        self.result = result
