"""What the doctor reads besides events.jsonl, always in bounded windows: the rank logs (the
traceback a failing rank printed), submitit's task logs (a worker that died before it opened its
own log), stack dumps (`diagnostics/`, or a faulthandler/py-spy dump in a rank log) and how each
local task ended (`localctl`). A week-long rank log may be gigabytes: a log is read from its last
TAIL_BYTES, a dump from its first DUMP_BYTES. Pure Python, no torch (`status` and the TUI read it
too)."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from . import fileio
from .runfolder import RunFolder
from .value import value

TAIL_BYTES = 256 << 10  # of a rank log: a traceback and what led to it
DUMP_BYTES = 64 << 10  # of a stack dump file
MAX_DUMPS = 64  # stack dump files looked at, newest first
PACKAGE = Path(__file__).resolve().parents[1]  # clusterfsdp's own code: a frame there is ours
EXIT_CODES = "{job_id}_exit_codes.json"  # in submitit/<job id>/: the local controller's record (localctl)


def tail_lines(path: Path, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The lines of the last `max_bytes` of a file (the first one dropped when cut); [] if unreadable."""
    try:
        with fileio.open_regular(path) as f:  # (a FIFO planted in a run folder would block a read)
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read(max_bytes)
    except OSError:
        return []
    lines = data.decode("utf-8", errors="replace").splitlines()
    return lines[1:] if size > max_bytes else lines


def head_lines(path: Path, max_bytes: int = DUMP_BYTES) -> list[str]:
    try:
        return fileio.read_bytes(path, max_bytes).decode("utf-8", errors="replace").splitlines()
    except OSError:
        return []


def traceback_lines(lines: list[str]) -> list[str]:
    """Of the last traceback among `lines`: its innermost frame (the `File` line and its code) and
    the exception line; [] without one."""
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last):")]
    if not starts:
        return []
    block = lines[starts[-1] :]
    frames = [i for i, line in enumerate(block) if line.startswith('  File "')]
    if not frames:
        return block[:3]
    last = frames[-1]
    shown = [block[last]]
    rest = block[last + 1 :]
    if rest and rest[0].startswith("    "):
        shown.append(rest[0])
    exception = next((line for line in rest if line and not line.startswith(" ")), "")
    return [*shown, exception] if exception else shown


_TRACEBACK_FRAME = r'^  File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)'


@value(frozen=True)
class Frame:
    """The innermost frame of a traceback: where the exception came from."""

    file: str
    line: int
    func: str
    code: str  # the source line the traceback shows ('' when it shows none)

    @classmethod
    def innermost(cls, shown: list[str]) -> Frame | None:
        """From `traceback_lines`' answer; None without a frame."""
        m = re.match(_TRACEBACK_FRAME, shown[0]) if shown else None
        if m is None:
            return None
        code = shown[1].strip() if len(shown) > 2 and shown[1].startswith("    ") else ""
        return cls(m["file"], int(m["line"]), m["func"], code)

    def own(self) -> str:
        """'clusterfsdp/data/samples.py' when the frame is clusterfsdp's own code, else ''. The
        path is the compute node's: it counts as ours when its part after the last
        `/clusterfsdp/` is a file of this installed package (a folder of user code that happens
        to be called clusterfsdp is not)."""
        _, sep, rel = self.file.rpartition("/clusterfsdp/")
        return f"clusterfsdp/{rel}" if sep and (PACKAGE / rel).is_file() else ""

    def raised_on_purpose(self) -> bool:
        """The frame's line is a `raise` statement (a deliberate error with its message), not
        an operation that failed (a division, an index, a call with the wrong arguments)."""
        return self.code.startswith("raise ")

    def describe(self) -> str:
        return f"{self.own() or self.file}:{self.line} in {self.func}"


_FAULTHANDLER_THREAD = r"^(Current thread|Thread) 0x[0-9a-f]+ .*\(most recent call first\):"
_FAULTHANDLER_FRAME = r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)'
_PYSPY_THREAD = r"^Thread \d+ \(\w+\)"
_PYSPY_FRAME = r"^\s+(?P<func>\S+) \((?P<file>[^():]+):(?P<line>\d+)\)"


def stuck_frame(lines: list[str]) -> tuple[str, list[str]]:
    """The innermost frame of the main thread in a stack dump (faulthandler's, or py-spy's
    `dump`), and that thread's first frames; ('', []) without a dump. faulthandler lists the
    newest thread first, so without a thread name the main thread is the last block."""
    blocks: list[list[str]] = []
    for line in lines:
        if re.match(_FAULTHANDLER_THREAD, line) or re.match(_PYSPY_THREAD, line):
            blocks.append([line])
        elif blocks and (re.match(_FAULTHANDLER_FRAME, line) or re.match(_PYSPY_FRAME, line)):
            blocks[-1].append(line)
    blocks = [b for b in blocks if len(b) > 1]
    if not blocks:
        return "", []
    main = next((b for b in blocks if "MainThread" in b[0]), blocks[-1])
    m = re.match(_FAULTHANDLER_FRAME, main[1]) or re.match(_PYSPY_FRAME, main[1])
    assert m is not None
    return f"{m['func']} ({m['file']}:{m['line']})", [line.strip() for line in main[:4]]


def stack(run: RunFolder, key: str, rank: int | None) -> tuple[str, list[str], str]:
    """A stuck rank's stack in incarnation `key` ('<job>.<restart>'): a dump under diagnostics/
    naming its incarnation and rank (newest first), else a dump in its rank log."""
    name = f"rank{rank}"
    folder = run.path / "diagnostics"
    dumps = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    dumps = sorted(dumps, key=lambda p: (key in p.as_posix(), name in p.name, p.stat().st_mtime), reverse=True)
    candidates = [(p, head_lines(p)) for p in dumps[:MAX_DUMPS] if rank is None or name in p.name]
    if rank is not None:
        job_id, _, restart = key.rpartition(".")
        log = run.log_path(job_id, int(restart), rank)
        candidates.append((log, tail_lines(log)))
    for path, lines in candidates:
        frame, shown = stuck_frame(lines)
        if frame:
            return frame, shown, relative(run, path)
    return "", [], ""


def submitit_logs(run: RunFolder, job_id: str, rank: int) -> list[Path]:
    """submitit's task logs of a rank (`.err` first), where they exist: in submitit/<job>/ (a
    submit) or submitit/ (the script of a --dry-run submitted by hand)."""
    return [
        folder / f"{job_id}_{rank}_log.{suffix}"
        for folder in (run.submitit_dir / job_id, run.submitit_dir)
        for suffix in ("err", "out")
        if (folder / f"{job_id}_{rank}_log.{suffix}").is_file()
    ]


def submitit_traceback(run: RunFolder, job_id: str, rank: int) -> tuple[list[str], str]:
    """The traceback lines of a rank's submitit task log, and that log (relative); ([], '')."""
    for path in submitit_logs(run, job_id, rank):
        lines = traceback_lines(tail_lines(path))
        if lines:
            return lines, relative(run, path)
    return [], ""


def local_exit_code(run: RunFolder, job_id: str, restart: int, rank: int) -> int | None:
    """A local task's exit status as the local controller recorded it (localctl: one list per
    round of tasks, a round per restart); None when it was not recorded (Slurm, a run started
    some other way, an older run)."""
    path = run.submitit_dir / job_id / EXIT_CODES.format(job_id=job_id)
    try:
        rounds = fileio.loads(fileio.read_bytes(path, 64 << 10)) if path.is_file() else []
        code = rounds[min(restart, len(rounds) - 1)][rank] if rounds else None
    except (OSError, ValueError, TypeError, IndexError, KeyError):
        return None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def signal_name(code: int | None) -> str:
    """'signal 9 (SIGKILL)' for a process's negative exit status (Python's Popen), or a shell's
    or srun's 128 + N; '' for any other status."""
    number = -code if code is not None and code < 0 else (code - 128 if code is not None and 128 < code < 160 else 0)
    if not number:
        return ""
    try:
        return f"signal {number} ({signal.Signals(number).name})"
    except ValueError:
        return f"signal {number}"


def relative(run: RunFolder, path: Path) -> str:
    try:
        return path.relative_to(run.path).as_posix()
    except ValueError:
        return str(path)
