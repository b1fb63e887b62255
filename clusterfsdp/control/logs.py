"""Reading a run's logs: pick a rank and attempt, tail, follow across requeues.

Reads only new bytes (seek to the last offset), polls instead of inotify (NFS), and falls
back to submitit's own task logs when the worker never got far enough to open its log.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ..core import evidence, fileio, runfolder


def attempt_keys(run: runfolder.RunFolder) -> list[str]:
    """Attempt folders under logs/ ('<job id>.<restart>'), oldest first."""
    dirs = [p for p in run.logs_dir.glob("*.*") if p.is_dir()]
    return [p.name for p in sorted(dirs, key=lambda p: p.stat().st_mtime)]


def log_file(
    run: runfolder.RunFolder, rank: int = 0, attempt: str | None = None, job_id: str | None = None
) -> Path | None:
    """This rank's log for an attempt (default: the newest; of job `job_id` if given), else
    submitit's task log."""
    keys = attempt_keys(run)
    if job_id is not None:
        keys = [k for k in keys if k.rpartition(".")[0] == job_id]
    if attempt is None and keys:
        attempt = keys[-1]
    if attempt is not None:
        p = run.logs_dir / attempt / f"rank{rank}.log"
        if p.is_file():
            return p
    last = run.record().last
    if job_id is None and last is not None:
        job_id = last.job_id
    if job_id is not None:
        for folder in (run.submitit_dir / job_id, run.submitit_dir):  # submit, or a --dry-run script
            for suffix in ("out", "err"):
                p = folder / f"{job_id}_{rank}_log.{suffix}"
                if p.is_file() and p.stat().st_size:
                    return p
    return None


def task_log(run: runfolder.RunFolder, log: Path, rank: int) -> Path | None:
    """submitit's own task log of the rank whose log `log` is (`.err` first, the one with text),
    for a rank that wrote nothing to its own log: what a rank killed early, or one whose
    output went elsewhere, left (its start-up, warnings, a crash's last words); None without."""
    job_id = log.parent.name.rpartition(".")[0] if log.parent.parent == run.logs_dir else ""
    for path in evidence.submitit_logs(run, job_id, rank) if job_id else []:
        if path.stat().st_size:
            return path
    return None


class Banner(str):
    """A line `follow` writes itself, not the log's bytes (the CLI escapes it: `term.printable`)."""


def _banner(run: runfolder.RunFolder, path: Path) -> Banner:
    """The line `follow` writes when it starts reading a log of another attempt (a requeue, the
    new attempt of a resume), so a restart in the output is never mistaken for the old one."""
    where = path.parent.name if path.parent.parent == run.logs_dir else "submitit"
    return Banner(f"==> {where} ({path.name}) <==\n")


def tail(path: Path, lines: int = 200, max_bytes: int = 1 << 20) -> str:
    """The last `lines` lines, reading at most `max_bytes` from the end (fast on a 1 GB log)."""
    with fileio.open_regular(path) as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - max_bytes))
        data = f.read()
    return b"\n".join(data.splitlines()[-lines:]).decode("utf-8", errors="replace")


def follow(
    run: runfolder.RunFolder,
    rank: int,
    is_done: Callable[[], bool],
    poll_s: float = 0.5,
    from_start: bool = True,
    job_id: str | None = None,
) -> Iterator[str]:
    """Yield new text of the rank's newest log until `is_done()`; switches file on a requeue,
    with a banner line naming the attempt. With `job_id` (the attempt just queued by `submit` or
    `resume`), only that job's logs are read, from its first, banner first: an earlier attempt's
    log is not replayed."""
    current: Path | None = None
    offset = 0
    idle_after_done = 0
    while True:
        newest = log_file(run, rank, job_id=job_id)
        if newest is not None and newest != current:
            if current is not None or job_id is not None:
                yield _banner(run, newest)
            current, offset = newest, 0 if from_start or current is not None else newest.stat().st_size
        chunk = b""
        if current is not None:
            with fileio.open_regular(current) as f:
                f.seek(offset)
                chunk = f.read()
                offset = f.tell()
        if chunk:
            yield chunk.decode("utf-8", errors="replace")
            continue
        if is_done():
            idle_after_done += 1
            if idle_after_done > 2:  # a last look for lines written just before the end
                return
        time.sleep(poll_s)
