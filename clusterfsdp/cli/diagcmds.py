"""The commands that look into one run: `doctor` (why it failed) and `logs` (a rank's log), and
following a rank's log until the run ends, which `submit -f`, `resume -f` and `logs -f` share.
They read the run folder without the run service's submit machinery."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import IO

from ..control import doctor, logs, status, strictjson
from ..core import benchresults, ownership, term
from ..core.runfolder import RunFolder
from . import CliError
from .folders import find_folder


def log_output(path: Path) -> IO[str]:
    """Where a log's own bytes go: as they are (as `cat` shows them: progress bars, colours) when only
    you could have written the file; escaped like every other line (`term.SafeStream`) when another
    user could have (a run of theirs in a shared run root: escape sequences in it would drive your
    terminal)."""
    return term.raw(sys.stdout) if ownership.path_clause(path) is None else sys.stdout


def follow(folder: RunFolder, rank: int, job_id: str | None = None) -> int:
    """Stream a rank's log until the run ends (from attempt `job_id` on, if given)."""

    def done() -> bool:
        return status.run_status(folder).state.final

    own = log_output(folder.path / "logs")
    try:
        for text in logs.follow(folder, rank, done, job_id=job_id):
            out = sys.stdout if isinstance(text, logs.Banner) else own  # the log's own bytes: raw if yours
            out.write(text)
            out.flush()
    except KeyboardInterrupt:
        print(f"\nstopped following; the run goes on (clusterfsdp cancel {folder.id} stops it)", file=sys.stderr)
        return 130
    st = status.run_status(folder)
    print(f"run {folder.id}: {st.state}{' - ' + st.reason if st.reason else ''}", file=sys.stderr)
    return 0 if st.state == "COMPLETED" else 1


def cmd_doctor(args: argparse.Namespace) -> int:
    """`doctor RUN` (`doctor SWEEP`: sweepview.cmd_doctor)."""
    folder = find_folder(args)
    st = status.run_status(folder)
    found = doctor.diagnose(folder, st.events, st.state.live, st.state, st.reason)
    failed = benchresults.failures(folder)  # evaluations never fail the run: their own finding
    if args.json:
        print(strictjson.dumps({"schema": 1, **found.to_dict(), "benchmarks_failed": failed}))
        return 0
    print(f"run        {folder.id} ({folder.name})")
    print("\n".join(found.render()))
    for f in failed:
        print(f"benchmark  step {f['step']} failed: {f.get('error', '')}")
        print(f"           (training is not affected; after a fix: clusterfsdp bench {folder.id} --step {f['step']})")
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    folder = find_folder(args)
    if args.follow:
        return follow(folder, args.rank)
    path = logs.log_file(folder, args.rank, args.attempt)
    if path is None:
        have = ", ".join(logs.attempt_keys(folder)) or "none"
        raise CliError(f"run {folder.id}: no log for rank {args.rank} yet (attempts: {have})")
    text = logs.tail(path, args.lines)
    task = logs.task_log(folder, path, args.rank) if not text else None
    if task is not None:  # the rank wrote nothing itself: submitit's log of its task, and what the doctor says
        print(f"run {folder.id}: rank {args.rank} wrote nothing to its log ({path}); submitit's log of its task, "
              f"{task}:", file=sys.stderr)  # fmt: skip
        _say_why_the_rank_ended(folder, path.parent.name, args.rank)
        text = logs.tail(task, args.lines)
    elif not text:
        print(f"run {folder.id}: rank {args.rank}'s log is empty so far ({path})", file=sys.stderr)
        return 0
    print(text, file=log_output(path))  # the log's own bytes, as `cat` shows them (if yours)
    return 0


def _say_why_the_rank_ended(folder: RunFolder, key: str, rank: int) -> None:
    """The doctor's verdict on the incarnation `key` when it names this rank (a rank killed
    before it wrote anything), on stderr."""
    job_id, _, restart = key.rpartition(".")
    found = doctor.verdict(folder, folder.events(), job_id, int(restart)) if restart.isdigit() else None
    if found is not None and found.rank == rank:
        print(f"run {folder.id}: {found.finding}: {found.headline()}", file=sys.stderr)
