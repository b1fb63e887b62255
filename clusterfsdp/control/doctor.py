"""`clusterfsdp doctor RUN`: why a run failed, from its run folder alone (docs/recovery.md,
"Asking the doctor").

The evidence is what the workers and the batch script's job steps already leave: events.jsonl
(every rank that raised recorded a `failed` event with its time, host and exception; the job
steps recorded what Slurm did and how they classified it), the rank logs
(`logs/<job>.<restart>/rank<R>.log`, with the traceback each failing rank printed), submitit's
task logs (a worker that died before it opened its own log), and stack dumps (`diagnostics/`, or a
faulthandler/py-spy dump in a rank log). From these it names the first error across ranks in time
order, the rank and host it came from, the classified cause (`Finding`), the few log lines that
show it and what to do next. (A little over 500 lines: the reading, the ordering rules and the
words for each cause are one judgement and are kept together.)

Root causes before consequences: when one rank raises, the others then lose their peer and
record collective errors later; a rank that died without a record (SIGKILL, the OOM killer) or
stopped answering (a hang) is found by its absence among the ranks that reported (the same rule
as `control.outcomes.classify_failure`, which the batch script uses to decide on a restart).

Every log is read in bounded windows (its last TAIL_BYTES, a dump's first DUMP_BYTES), never whole:
a week-long rank log may be gigabytes. Pure Python, no torch: `status` and the TUI's run screen
show the same text. About 500 lines in one module: the evidence readers, the classification and
the advice for each cause change together.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from . import fileio
from .records import Cause, Event, EventKind, preflight_failures, preflight_verdict
from .runfolder import RunFolder

TAIL_BYTES = 256 << 10  # of a rank log: a traceback and what led to it
DUMP_BYTES = 64 << 10  # of a stack dump file
MAX_DUMPS = 64  # stack dump files looked at, newest first
MAX_EARLIER = 5  # earlier incarnations summed up in one line each


class Finding(StrEnum):
    """The classified cause of a failure, as the doctor names it (finer than `Cause`, which is
    what the restart policy needs: an out-of-memory and a data error are both `error` there)."""

    OOM = "oom"  # out of memory on the GPU (or the host)
    COLLECTIVE = "collective"  # an NCCL/gloo error: a lost peer, a broken connection
    HANG = "hang"  # a rank stopped making progress; the others waited in a collective
    NODE_FAILURE = "node_failure"
    PREEMPTED = "preempted"
    TIME_LIMIT = "time_limit"
    DATA_ERROR = "data_error"
    BAD_CONFIG = "bad_config"  # a Python error before the first step: the config, a file, the model
    PYTHON_ERROR = "python_error"  # a Python error during training, in the model or user code
    RANK_KILLED = "rank_killed"  # a rank died without an exception (SIGKILL, the OOM killer, a crash)
    CANCELLED = "cancelled"
    PREFLIGHT = "preflight"  # a node failed the pre-flight checks (GPUs, free space, network) and was left out
    UNKNOWN = "unknown"  # it ended badly and the run folder does not say why
    NONE = "none"  # nothing failed (completed, or still going)


@dataclass
class Diagnosis:
    """The doctor's answer for one run: its newest incarnation (job id, Slurm restart) that did not
    complete. `lines` are the log lines that show the cause, from `source` (relative to the run
    folder); `others` the later reports of the other ranks (consequences, in time order)."""

    run_id: str
    finding: Finding
    summary: str
    job_id: str = ""
    restart: int | None = None
    rank: int | None = None
    host: str = ""
    time: float | None = None
    step: int | None = None
    source: str = ""
    lines: list[str] = field(default_factory=list)
    stuck_frame: str = ""  # a hang: the innermost frame of the stuck rank's main thread
    others: list[str] = field(default_factory=list)
    earlier: list[str] = field(default_factory=list)  # how the incarnations before this one ended (newest last)
    next_steps: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "finding": self.finding.value}

    def where(self) -> str:
        """'rank 1 on node2, job 41.0, step 3'."""
        parts = [f"rank {self.rank}" + (f" on {self.host}" if self.host else "")] if self.rank is not None else []
        if self.job_id:
            parts.append(f"job {self.job_id}.{self.restart}")
        if self.step is not None:
            parts.append(f"last step {self.step}")
        return ", ".join(parts)

    def render(self, short: bool = False) -> list[str]:
        """The text `doctor` prints; `short`: the block under `status` (fewer lines)."""
        out = [f"cause      {self.finding}: {self.summary}"]
        if self.where():
            out.append(f"where      {self.where()}")
        if self.stuck_frame:
            out.append(f"stuck in   {self.stuck_frame}")
        shown = self.lines[-3:] if short else self.lines
        if shown:
            out.append(f"log        {self.source}")
            out += [f"  | {line}" for line in shown]
        if not short:
            out += [f"then       {other}" for other in self.others]
            out += [f"earlier    {line}" for line in self.earlier]
        out += [f"next       {step}" for step in (self.next_steps[:1] if short else self.next_steps)]
        return out


# ---------------------------------------------------------------- reading logs, bounded
def tail_lines(path: Path, max_bytes: int = TAIL_BYTES) -> list[str]:
    """The lines of the last `max_bytes` of a file (the first one dropped when cut); [] if unreadable."""
    try:
        with fileio.open_regular(path) as f:
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


# ---------------------------------------------------------------- classifying an error text
_OOM = ("out of memory", "outofmemoryerror", "cuda error: out of memory", "cudaerrormemoryallocation",
        "cublas_status_alloc_failed", "std::bad_alloc", "cannot allocate memory")  # fmt: skip
_DATA = ("dataerror", "data.paths", "data.tokenizer", "not valid json", "prepared data")


def finding_of(reason: str, steps_done: int | None, cause: Cause | None) -> Finding:
    """The class of one rank's recorded exception ('rank 1 on n1: OutOfMemoryError: CUDA out of memory')."""
    text = reason.lower()
    if any(word in text for word in _OOM):
        return Finding.OOM
    if any(word in text for word in _DATA):
        return Finding.DATA_ERROR
    if cause is Cause.COLLECTIVE:
        return Finding.COLLECTIVE
    return Finding.PYTHON_ERROR if steps_done else Finding.BAD_CONFIG


def _next_steps(finding: Finding, run_id: str, detail: str = "") -> list[str]:
    resume = f"clusterfsdp resume {run_id}"
    return {
        Finding.OOM: [
            f"{resume} --set train.micro_batch_size=N  (smaller; raise train.grad_accum to keep the global batch)",
            "or turn on activation checkpointing / use more GPUs (each rank then holds a smaller shard)",
        ],
        Finding.COLLECTIVE: [
            "look at the rank named first: a lost peer is usually the consequence of a rank that died or hung",
            f"{resume}  (it resumes from the newest checkpoint)",
        ],
        Finding.HANG: [
            "read the stuck frame: a data worker, a file system or a GPU that stopped answering",
            f"{resume} --set slurm.exclude=...  when the node is suspect" if detail else f"{resume}",
        ],
        Finding.NODE_FAILURE: [
            f"nothing, if an automatic restart followed; else {resume} (the failed node is excluded)",
            f"ask the admins about {detail}" if detail else "ask the admins about the node",
        ],
        Finding.PREEMPTED: [
            "nothing: the run saved and comes back by itself",
            "use a partition that is not preempted, or raise slurm.signal_grace_s if the save was cut off",
        ],
        Finding.TIME_LIMIT: [
            "nothing: the run saved and comes back by itself",
            f"{resume} --set slurm.time=MINUTES  for fewer requeues",
        ],
        Finding.DATA_ERROR: [
            "fix or remove the record named above (clusterfsdp validate checks only the first record of each file)",
            f"then {resume}",
        ],
        Finding.BAD_CONFIG: [
            "fix the job (the error above names the key, the file or the model); it failed before the first step",
            f"then {resume} --set KEY=VALUE",
        ],
        Finding.PYTHON_ERROR: [
            "fix the code in the innermost frame above (the error repeats at the same step)",
            f"then {resume}",
        ],
        Finding.RANK_KILLED: [
            "check the node's memory (the OOM killer) and `dmesg`/`sacct` for the signal",
            f"{resume}  (it resumes from the newest checkpoint)",
        ],
        Finding.CANCELLED: [f"{resume}  continues from the saved checkpoint"],
        Finding.PREFLIGHT: [
            f"nothing, if an automatic restart followed without {detail or 'the node'}; else {resume}",
            "fix the node (free space, GPUs, network) or tell the admins; slurm.preflight = false skips the checks",
        ],
        Finding.UNKNOWN: [f"clusterfsdp logs {run_id} --rank R  for each rank, and the submitit/ logs"],
        Finding.NONE: [],
    }[finding]


# ---------------------------------------------------------------- the diagnosis
_FROM_CAUSE = {
    Cause.NODE_FAILURE: Finding.NODE_FAILURE,
    Cause.PREEMPTED: Finding.PREEMPTED,
    Cause.REQUEUED_BY_SLURM: Finding.PREEMPTED,
    Cause.TIME_LIMIT: Finding.TIME_LIMIT,
    Cause.CANCELLED: Finding.CANCELLED,
}
_TIMEOUT = ("timed out", "timeout")


@dataclass
class _Incarnation:
    job_id: str
    restart: int
    events: list[Event]
    hangs: list[Event]  # a node watchdog's records (EventKind.HANG): the ranks that stopped making progress


def _incarnations(run: RunFolder, events: list[Event]) -> list[_Incarnation]:
    """Every incarnation with events or logs, in the order they started."""
    found: dict[tuple[str, int], _Incarnation] = {}
    for e in events:
        inc = found.setdefault((e.job_id, e.restart), _Incarnation(e.job_id, e.restart, [], []))
        (inc.hangs if e.event is EventKind.HANG else inc.events).append(e)
    for folder in sorted(run.logs_dir.glob("*.*"), key=lambda p: p.stat().st_mtime) if run.logs_dir.is_dir() else []:
        job_id, _, restart = folder.name.rpartition(".")
        if restart.isdigit():
            found.setdefault((job_id, int(restart)), _Incarnation(job_id, int(restart), [], []))
    return list(found.values())


def diagnose(run: RunFolder, events: list[Event] | None = None, live: bool = False) -> Diagnosis:
    """Why the run's newest incarnation that did not complete ended; Finding.NONE when the newest
    one completed, or (`live`: the attempt still runs) when nothing has ended and no rank hung."""
    events = run.events() if events is None else events
    incarnations = _incarnations(run, events)
    if not incarnations:
        return _submitit_only(run)
    newest = incarnations[-1]
    found = None
    if any(e.event is EventKind.COMPLETED for e in newest.events):
        found = Diagnosis(run.id, Finding.NONE, "the run completed", newest.job_id, newest.restart)
    elif live and not newest.hangs and not any(e.event.ends_attempt for e in newest.events):
        found = Diagnosis(run.id, Finding.NONE, "the attempt is running", newest.job_id, newest.restart)
    else:
        # the job step refusing to start (restarts used up) says nothing of the failure: the one before does
        while len(incarnations) > 1 and _refusal(incarnations[-1]):
            incarnations.pop()
        found = _diagnose(run, incarnations[-1])
    found.earlier = [_one_line(_diagnose(run, inc)) for inc in incarnations[:-1][-MAX_EARLIER:]]
    return found


def _refusal(inc: _Incarnation) -> bool:
    return bool(inc.events) and all(e.rank < 0 and e.cause is Cause.RESTARTS_EXHAUSTED for e in inc.events)


def _one_line(d: Diagnosis) -> str:
    """'job 41.0: time_limit: SIGUSR2 ahead of the time limit; saved step 16' (`earlier`)."""
    text = f"job {d.job_id}.{d.restart}: {d.finding}: {d.summary}"
    return text if len(text) <= 200 else text[:197] + "..."


def _diagnose(run: RunFolder, inc: _Incarnation) -> Diagnosis:
    base = Diagnosis(run.id, Finding.UNKNOWN, "", inc.job_id, inc.restart)
    ranks = [e for e in inc.events if e.event is EventKind.FAILED and e.rank >= 0]
    failed = sorted((e for e in ranks if e.cause is not Cause.RESTARTS_EXHAUSTED), key=lambda e: e.time)
    exhausted = next((e for e in inc.events if e.cause is Cause.RESTARTS_EXHAUSTED), None)
    start = next((e for e in inc.events if e.event is EventKind.START), None)
    world = start.world_size if start else None
    # what Slurm did (job steps, or rank 0 after a save): a node, a preemption, the time limit
    told = [e for e in inc.events if e.cause in _FROM_CAUSE and e.event is not EventKind.FAILED]
    if inc.hangs:
        return _hang(run, inc, base, failed, world, inc.hangs)
    preflight = preflight_failures(failed)
    if preflight:
        return _preflight(run, base, preflight[0])
    if told:
        first = told[0]
        finding = _FROM_CAUSE[first.cause] if first.cause else Finding.UNKNOWN
        nodes = ",".join(next((e.failed_nodes for e in inc.events if e.failed_nodes), []))
        base.finding, base.summary, base.time, base.step = finding, first.reason, first.time, first.step
        base.host = nodes
        base.next_steps = _next_steps(finding, run.id, nodes)
        return base
    if exhausted is not None and not failed:
        return _exhausted(run, base, exhausted)
    errors = [e for e in failed if e.cause is not Cause.COLLECTIVE]
    if errors:
        return _error(run, inc, base, errors[0], failed)
    silent = _silent_ranks(failed, world)
    if failed and silent and any(word in e.reason.lower() for e in failed for word in _TIMEOUT):
        return _hang(run, inc, base, failed, world, [])
    if silent:  # the rule of control.outcomes.classify_failure: a rank that never reported died
        return _killed(run, inc, base, silent, failed)
    if failed:
        return _error(run, inc, base, failed[0], failed)
    gave_up = [e for e in inc.events if e.event in (EventKind.GAVE_UP, EventKind.AUTO_RESTART)]
    if gave_up:
        base.summary, base.time = gave_up[0].reason, gave_up[0].time
        base.finding = Finding.RANK_KILLED if gave_up[0].cause is Cause.RANK_KILLED else Finding.UNKNOWN
    elif start is not None:
        base.summary = "the workers ended without a record (killed?)"
    else:
        return _submitit_only(run, base)
    base.next_steps = _next_steps(base.finding, run.id)
    return base


def _exhausted(run: RunFolder, base: Diagnosis, record: Event) -> Diagnosis:
    """Rank 0 stopped after a time limit or a preemption that saved nothing newer, with
    slurm.max_restarts used up (a loop that never advances): the interruption is the cause."""
    text = record.reason.lower()
    base.finding = (
        Finding.PREEMPTED if "preempt" in text
        else Finding.TIME_LIMIT if "time limit" in text or "sigusr2" in text
        else Finding.UNKNOWN
    )  # fmt: skip
    base.rank, base.host, base.time, base.step, base.summary = (
        record.rank,
        record.host,
        record.time,
        record.step,
        record.reason,
    )
    base.next_steps = [
        "the run stopped: it was interrupted again before it saved anything newer, and slurm.max_restarts ran out",
        f"clusterfsdp resume {run.id} --set slurm.time=MINUTES  (or a larger slurm.signal_grace_s, so a save fits)",
    ]
    return base


def _preflight(run: RunFolder, base: Diagnosis, first: Event) -> Diagnosis:
    """A node failed its pre-flight (worker.preflight): every rank raised the same line naming it."""
    nodes = ",".join(first.failed_nodes)
    base.finding, base.host, base.time = Finding.PREFLIGHT, nodes, first.time
    base.summary = preflight_verdict(first)
    base.next_steps = _next_steps(Finding.PREFLIGHT, run.id, nodes)
    return base


def _silent_ranks(failed: list[Event], world: int | None) -> list[int]:
    reported = {e.rank for e in failed}
    return [r for r in range(world or 0) if r not in reported]


def _others(failed: list[Event], first: Event | None) -> list[str]:
    return [f"{e.reason[:200]}" for e in failed if e is not first]


def _error(run: RunFolder, inc: _Incarnation, base: Diagnosis, first: Event, failed: list[Event]) -> Diagnosis:
    """A rank that raised: the first one in time order (a Python error before the others' collective errors)."""
    base.finding = finding_of(first.reason, first.steps_done, first.cause)
    base.rank, base.host, base.time, base.step = first.rank, first.host, first.time, first.step
    reason = re.sub(r"^rank \d+ on \S+: ", "", first.reason)
    base.summary = reason if len(reason) <= 240 else reason[:237] + "..."
    log = run.log_path(inc.job_id, inc.restart, first.rank)
    base.lines, base.source = traceback_lines(tail_lines(log)), _relative(run, log)
    if not base.lines:
        base.lines, base.source = _submitit_lines(run, inc.job_id, first.rank)
    base.others = _others(failed, first)
    base.next_steps = _next_steps(base.finding, run.id)
    return base


def _killed(run: RunFolder, inc: _Incarnation, base: Diagnosis, silent: list[int], failed: list[Event]) -> Diagnosis:
    """Ranks that died without an exception: the first silent rank's last log lines say where."""
    rank = silent[0]
    log = run.log_path(inc.job_id, inc.restart, rank)
    base.finding, base.rank = Finding.RANK_KILLED, rank
    base.host = _host_of(run, inc, rank)
    base.summary = (f"rank(s) {', '.join(map(str, silent))} died without an exception (SIGKILL, the OOM killer, "
                    "a segfault); the other ranks then lost their peer")  # fmt: skip
    base.lines = [line for line in tail_lines(log)[-3:] if line.strip()]  # what it was doing (rank 0 logs most)
    base.source = _relative(run, log) if base.lines else ""
    base.time = failed[0].time if failed else None
    base.others = _others(failed, None)
    base.next_steps = _next_steps(Finding.RANK_KILLED, run.id)
    return base


def _hang(
    run: RunFolder, inc: _Incarnation, base: Diagnosis, failed: list[Event], world: int | None, hangs: list[Event]
) -> Diagnosis:
    """A rank stopped making progress: named by a watchdog's `hang` record, else the rank that
    never reported while the others timed out in a collective; its stack from a dump, if any."""
    if hangs:
        first = hangs[0]
        rank = first.rank if first.rank >= 0 else None
        base.host, base.time, base.summary, base.step = first.host, first.time, first.reason, first.step
    else:
        silent = _silent_ranks(failed, world)
        rank = silent[0]
        base.time = failed[0].time
        base.summary = (f"rank(s) {', '.join(map(str, silent))} stopped making progress; the other ranks timed out "
                        "waiting for them in a collective")  # fmt: skip
    base.finding, base.rank = Finding.HANG, rank
    base.host = base.host or (_host_of(run, inc, rank) if rank is not None else "")
    frame, lines, source = _stack(run, inc, rank)
    base.stuck_frame, base.lines, base.source = frame, lines, source
    if not frame:
        base.summary += "; no stack dump in the run folder"
    base.others = _others(failed, None)
    base.next_steps = _next_steps(Finding.HANG, run.id, base.host)
    return base


def _stack(run: RunFolder, inc: _Incarnation, rank: int | None) -> tuple[str, list[str], str]:
    """The stuck rank's stack: a dump under diagnostics/ naming its incarnation and rank (newest
    first), else a dump in its rank log."""
    key, name = f"{inc.job_id}.{inc.restart}", f"rank{rank}"
    folder = run.path / "diagnostics"
    dumps = [p for p in folder.rglob("*") if p.is_file()] if folder.is_dir() else []
    dumps = sorted(dumps, key=lambda p: (key in p.as_posix(), name in p.name, p.stat().st_mtime), reverse=True)
    candidates = [(p, head_lines(p)) for p in dumps[:MAX_DUMPS] if rank is None or name in p.name]
    if rank is not None:
        log = run.log_path(inc.job_id, inc.restart, rank)
        candidates.append((log, tail_lines(log)))
    for path, lines in candidates:
        frame, shown = stuck_frame(lines)
        if frame:
            return frame, shown, _relative(run, path)
    return "", [], ""


def _host_of(run: RunFolder, inc: _Incarnation, rank: int) -> str:
    """The host of a rank that left no event: the node record (nodes/<job>.<restart>/<host>.json,
    written by each node's first rank) whose ranks include it."""
    folder = run.nodes_dir / f"{inc.job_id}.{inc.restart}"
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            dist = fileio.loads(fileio.read_bytes(path, 64 << 10)).get("dist", {})
            first, count = int(dist["rank"]), int(dist["local_world_size"])
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            continue
        if first <= rank < first + count:
            return path.stem
    return ""


def _submitit_lines(run: RunFolder, job_id: str, rank: int) -> tuple[list[str], str]:
    for folder in (run.submitit_dir / job_id, run.submitit_dir):
        path = folder / f"{job_id}_{rank}_log.err"
        lines = traceback_lines(tail_lines(path))
        if lines:
            return lines, _relative(run, path)
    return [], ""


def _submitit_only(run: RunFolder, base: Diagnosis | None = None) -> Diagnosis:
    """No worker record at all: a worker that failed before it set up its log (an import error, a
    container that did not start) leaves only submitit's task logs."""
    last = run.record().last
    base = base or Diagnosis(run.id, Finding.NONE, "nothing ran yet")
    if last is None:
        return base
    base.job_id = base.job_id or last.job_id
    lines, source = _submitit_lines(run, last.job_id, 0)
    if lines:
        base.finding, base.lines, base.source, base.rank = Finding.BAD_CONFIG, lines, source, 0
        base.summary = f"the workers failed before they started: {lines[-1]}"
        base.next_steps = _next_steps(Finding.BAD_CONFIG, run.id)
    return base


def _relative(run: RunFolder, path: Path) -> str:
    try:
        return path.relative_to(run.path).as_posix()
    except ValueError:
        return str(path)
