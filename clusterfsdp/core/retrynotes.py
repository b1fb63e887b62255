"""Who hears, in one line, that a Slurm command is being retried (slurmcli waits out a controller
that does not answer): per context, so a thread starts quiet and the TUI's threads and library
callers stay quiet whatever the process's entry point chose. The CLI says it on stderr, the worker
and the batch script's job steps in their logs.

Apart from `slurmcli` so that the CLI can set it up for every command without importing slurmcli
(and its records) for the commands that never call Slurm: start-up is paid on every call."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from contextvars import ContextVar

_on_retry: ContextVar[Callable[[str], None] | None] = ContextVar("clusterfsdp_slurm_on_retry", default=None)


def listener() -> Callable[[str], None] | None:
    """Who is told of a retry in this context (None: nobody)."""
    return _on_retry.get()


def report_retries(report: Callable[[str], None] | None) -> None:
    """From here on in this thread, the first retry of a command is told to `report`."""
    _on_retry.set(report)


@contextlib.contextmanager
def retry_notices(report: Callable[[str], None] | None) -> Iterator[None]:
    """`report_retries` for the length of a block."""
    token = _on_retry.set(report)
    try:
        yield
    finally:
        _on_retry.reset(token)


def say_on_stderr(message: str) -> None:
    """A retry report for command-line use (`report_retries`)."""
    print(f"note: {message}", file=sys.stderr, flush=True)
