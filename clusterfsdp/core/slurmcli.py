"""Thin, typed wrappers over Slurm's client commands (sbatch, squeue, sacct, sinfo, scancel,
scontrol), each retried while the controller is busy, restarting or unreachable.

One batched call per question (all job ids at once), plain `-o`/`--parsable2` text output
(stable across Slurm versions, unlike `--json` whose shapes changed between 22.05 and 24.x),
and a one-line `SlurmError` instead of a traceback when a command is missing or fails.

Controller outages (docs/recovery.md): a command whose error is one of `TRANSIENT` (or that
does not answer within its own timeout) is tried again with backoff (1, 2, 4, ... 15 s) until a
bounded time has passed (`retry_budget_s`: $CLUSTERFSDP_SLURM_RETRY_S, default 180 s; queries
at most 30 s), then fails with a message that says so. Commands that change something are made
safe to repeat: a submission carries a unique `--comment` and is looked up before it is sent
again (a timed-out sbatch may still have created the job: seen on the devcluster), and is held
until the caller recorded it; a requeue, release or cancel that "fails" after an earlier try
timed out is checked against the job's state before it counts as failed.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from . import retrynotes
from .errors import UserError
from .records import RunState
from .slurmping import controller
from .value import value

# Inherited variables that say which cluster to talk to, not what a job gets: kept through every
# scrub of SLURM_* (launch.submission_env, a rank's benchmark queueing). submitit's clean_env drops
# every SLURM_*, so sbatch read /etc/slurm/slurm.conf while the scontrol/squeue calls around it read
# $SLURM_CONF: a user with SLURM_CONF set queued the job on another cluster (or none) and then
# failed to release it there.
CLUSTER_ENV = ("SLURM_CONF", "SLURM_CLUSTERS")

T = TypeVar("T")

# What a client prints when the controller (or slurmdbd, for sacct) is down, restarting, busy or
# failing over. Seen on the devcluster: "Unable to contact slurm controller (connect failure)"
# (slurmctld stopped), "Socket timed out on send/recv operation" (slurmctld hung), and
# `scontrol requeue`'s "Unexpected message received for job N" in both cases. The others are
# from Slurm's source (docs/recovery.md).
TRANSIENT = (
    "unable to contact slurm controller",
    "socket timed out on send/recv",
    "zero bytes were transmitted or received",
    "send failure",
    "receive failure",
    "standby mode",
    "temporarily unable to accept job",
    "resource temporarily unavailable",
    "job can not be altered now",
    "slurm job queue full",
    "job creation temporarily disabled",
    "unexpected message received",
    "failed to open persistent connection",
    "problem talking to the database",
    "sending persistinit msg",
)
ENV_RETRY_S = "CLUSTERFSDP_SLURM_RETRY_S"
QUERY_RETRY_S = 30.0  # status and the TUI should not hang for minutes
MAX_DELAY_S = 15.0


class SlurmError(UserError, RuntimeError):
    """A Slurm command failed; `transient` when the controller could not be reached (and the
    retry budget, if any, ran out)."""

    def __init__(self, message: str, transient: bool = False):
        super().__init__(message)
        self.transient = transient


@value(frozen=True)
class JobRow:
    job_id: str
    state: str
    reason: str = ""
    elapsed: str = ""
    nodes: str = ""
    exit_code: str = ""
    by: str = ""  # sacct's `CANCELLED by UID`: the uid of who cancelled the job


@value(frozen=True)
class JobInfo:
    """`scontrol -o show job`: what tells a preemption from a cancel, and where the job ran.
    `preempt_time` is "" when Slurm prints None or hides it (a requeued job's base state is
    PENDING then; docs/recovery.md)."""

    job_id: str
    state: str
    reason: str
    restarts: int
    preempt_time: str
    requeue: bool
    nodes: str
    batch_host: str
    partition: str

    @classmethod
    def parse(cls, line: str) -> JobInfo:
        fields = dict(word.split("=", 1) for word in line.split() if "=" in word)
        preempt = fields.get("PreemptTime", "None")
        return cls(
            job_id=fields.get("JobId", ""),
            state=fields.get("JobState", ""),
            reason=fields.get("Reason", ""),
            restarts=int(fields.get("Restarts", "0") or 0),
            preempt_time="" if preempt in ("None", "Unknown") else preempt,
            requeue=fields.get("Requeue", "1") == "1",
            nodes=fields.get("NodeList", ""),
            batch_host=fields.get("BatchHost", ""),
            partition=fields.get("Partition", ""),
        )


def retry_budget_s() -> float:
    """Seconds a command is retried while the controller does not answer."""
    try:
        return max(0.0, float(os.environ.get(ENV_RETRY_S, "180")))
    except ValueError:
        return 180.0


def _is_transient(text: str) -> bool:
    low = text.lower()
    return any(pattern in low for pattern in TRANSIENT)


def _once(cmd: list[str], timeout: float) -> str:
    """Run a Slurm command once; stdout, or SlurmError with Slurm's own message."""
    if shutil.which(cmd[0]) is None:
        raise SlurmError(f"{cmd[0]}: command not found (is Slurm installed on this machine?)")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{cmd[0]}: no answer within {timeout:.0f} s", transient=True) from None
    if proc.returncode != 0:
        msg = " ".join((proc.stderr or proc.stdout).split()) or f"exit status {proc.returncode}"
        # Slurm's own messages start with the command's name ("squeue: error: ..."): name it once.
        text = msg if msg.startswith(f"{cmd[0]}: ") else f"{cmd[0]}: {msg}"
        raise SlurmError(text, transient=_is_transient(msg))
    return proc.stdout


def retrying(what: str, attempt: Callable[[], T], budget_s: float | None = None) -> T:
    """attempt() until it returns or raises a SlurmError that is not transient; transient errors
    are retried with backoff until `budget_s` (default `retry_budget_s()`) has passed."""
    budget = retry_budget_s() if budget_s is None else budget_s
    t0 = time.monotonic()
    delay = 1.0
    while True:
        try:
            return attempt()
        except SlurmError as e:
            if not e.transient:
                raise
            if budget <= 0:
                raise  # no retries asked for: Slurm's own message
            waited = time.monotonic() - t0
            detail = str(e).removeprefix(f"{what}: ")  # name the command once
            if waited + delay > budget:
                raise SlurmError(
                    f"{what}: the Slurm controller did not answer for {waited:.0f} s ({detail}); "
                    "try again once `scontrol ping` says UP",
                    transient=True,
                ) from None
            report = retrynotes.listener()
            if delay == 1.0 and report is not None:
                report(f"{what}: Slurm does not answer ({detail}); retrying for up to {budget:.0f} s")
            time.sleep(delay)
            delay = min(delay * 2, MAX_DELAY_S)


def run(cmd: list[str], timeout: float = 30, retry_s: float | None = None) -> str:
    """Run a Slurm command, retried on transient errors (a query for at most QUERY_RETRY_S, so
    `status` and the TUI answer; a command that changes something for the whole budget); stdout
    or SlurmError."""
    if retry_s is None:
        query = cmd[0] in ("squeue", "sacct", "sinfo") or cmd[:2] in (["scontrol", "show"], ["scontrol", "-o"])
        retry_s = min(QUERY_RETRY_S, retry_budget_s()) if query else None
    return retrying(cmd[0], lambda: _once(cmd, timeout), retry_s)


def version() -> tuple[int, int] | None:
    """(major, minor) of the installed Slurm (`sbatch --version`: 'slurm 22.05.8'); None if unknown."""
    try:
        words = run(["sbatch", "--version"], timeout=10).split()
        major, minor = words[1].split(".")[:2]
        return int(major), int(minor)
    except (SlurmError, IndexError, ValueError):
        return None


def available() -> bool:
    """sbatch is installed and a controller answers (`scontrol ping`), so a job can be queued."""
    return controller() == "up"


def wait_for_controller(what: str) -> None:
    """Return once the controller answers; SlurmError after the retry budget."""

    def ping() -> None:
        state = controller()
        if state == "none":
            raise SlurmError(f"{what}: no Slurm controller is configured on this machine")
        if state == "down":
            raise SlurmError("scontrol ping: the controller is DOWN", transient=True)

    retrying(what, ping)


def squeue(job_ids: list[str] | None = None) -> dict[str, JobRow]:
    """Queued/running jobs: the given ids, or all of the current user's. One call."""
    cmd = ["squeue", "-h", "-r", "-o", "%i|%T|%r|%M|%N"]  # -r: an array's pending tasks one per line
    if job_ids:
        cmd += ["-j", ",".join(job_ids)]
    else:
        cmd += ["-u", _user()]
    try:
        out = run(cmd)
    except SlurmError as e:
        if "Invalid job id" in str(e):  # every listed job has left squeue
            return {}
        raise
    rows = {}
    for line in out.splitlines():
        job_id, state, reason, elapsed, nodes = (line.split("|") + [""] * 5)[:5]
        rows[job_id] = JobRow(job_id, state, reason, elapsed, nodes)
    return rows


def sacct(job_ids: list[str]) -> dict[str, JobRow]:
    """Accounting rows for finished jobs (the allocation row of each, not its steps). One call."""
    if not job_ids:
        return {}
    out = run(
        ["sacct", "-n", "-X", "-P", "-o", "JobID,State,Reason,Elapsed,NodeList,ExitCode", "-j", ",".join(job_ids)]
    )
    rows = {}
    for line in out.splitlines():
        job_id, state, reason, elapsed, nodes, code = (line.split("|") + [""] * 6)[:6]
        words = state.split()
        by = words[2] if len(words) == 3 and words[1] == "by" else ""
        rows[job_id] = JobRow(job_id, words[0] if words else "", reason, elapsed, nodes, code, by)
    return rows


def describe_uid(uid: str) -> str:
    """'alice (uid 1000)' for sacct's `CANCELLED by 1000`; the uid alone when it has no name here."""
    try:
        return f"{pwd.getpwuid(int(uid)).pw_name} (uid {uid})"
    except (KeyError, ValueError):
        return f"uid {uid}"


def job_states(job_ids: list[str]) -> dict[str, JobRow]:
    """squeue for live jobs, sacct for the ones that left the queue; copes with sacct being disabled.
    A job squeue no longer lists is not live, whatever accounting's last record says: the
    controller's state is taken where it still knows the job, else a REQUEUED record (a job
    cancelled while being requeued) is reported CANCELLED. Measured on Slurm 22.05: `scontrol
    requeue` then `scancel` before the job pends again leaves sacct's last record at REQUEUED
    (mostly for good; under load slurmdbd sometimes records the cancel seconds later), while the
    controller says CANCELLED."""
    rows = squeue(job_ids)
    missing = [j for j in job_ids if j not in rows]
    if missing:
        try:
            rows.update(_settled(row) for row in sacct(missing).values())
        except SlurmError:
            pass  # accounting disabled: finished jobs are judged from the run folder alone
    return rows


def _settled(row: JobRow) -> tuple[str, JobRow]:
    if not RunState.parse(row.state).live:
        return row.job_id, row
    try:
        info = show_job(row.job_id)
    except SlurmError:
        return row.job_id, row
    if info is not None:  # the controller's word (it may also have queued the job again meanwhile)
        return row.job_id, replace(row, state=info.state, reason=info.reason)
    if row.state.startswith("REQUEUE"):
        return row.job_id, replace(row, state="CANCELLED", reason="cancelled while being requeued")
    return row.job_id, row  # accounting lags a job that just ended: the next look settles it


def show_job(job_id: str, retry_s: float | None = None) -> JobInfo | None:
    """`scontrol -o show job`; None once Slurm no longer knows the job (MinJobAge passed)."""
    try:
        out = run(["scontrol", "-o", "show", "job", job_id], retry_s=retry_s)
    except SlurmError as e:
        if "Invalid job id" in str(e):
            return None
        raise
    line = next((ln for ln in out.splitlines() if ln.startswith("JobId=")), "")
    return JobInfo.parse(line) if line else None


def node_states(nodes: list[str]) -> dict[str, str]:
    """{node: sinfo's state word} (`down*`, `idle`, `allocated*`, `drained`, ...; a trailing `*`
    means the node does not respond)."""
    if not nodes:
        return {}
    out = run(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N|%T"])
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def cluster_name() -> str:
    """Slurm's ClusterName: $SLURM_CLUSTER_NAME inside a job, else `scontrol show config`."""
    name = os.environ.get("SLURM_CLUSTER_NAME", "").strip()
    if name:
        return name
    out = run(["scontrol", "show", "config"], retry_s=0)  # (best effort: no quarantine beats a wait)
    line = next((ln for ln in out.splitlines() if ln.split("=", 1)[0].strip() == "ClusterName"), "")
    return line.split("=", 1)[1].strip() if "=" in line else ""


def partition_nodes(partition: str = "") -> dict[str, str]:
    """{node: state} of a partition (default: the cluster's default partition)."""
    if not partition:
        names = run(["sinfo", "-h", "-o", "%P"]).split()
        partition = next((p.rstrip("*") for p in names if p.endswith("*")), names[0].rstrip("*") if names else "")
    out = run(["sinfo", "-h", "-N", "-p", partition, "-o", "%N|%T"])
    return dict(line.split("|", 1) for line in out.splitlines() if "|" in line)


def usable(state: str) -> bool:
    """A node state in which a job can run (not down, drained, failed, or not responding)."""
    word = state.rstrip("~#!%$@^-")
    if word.endswith("*"):
        return False
    return word.split("+")[0] in ("idle", "mixed", "allocated", "completing", "planned", "reserved")


_JOB_ID = r"\d+(_\d+)?"


def batch_job_id(env: Mapping[str, str]) -> str:
    """The id of the job this environment belongs to, as squeue, sacct, scancel and scontrol take
    it and the run records it: `<array id>_<task id>` for a task of a sweep's job array (whose
    own SLURM_JOB_ID is an id no submitter knew), else SLURM_JOB_ID."""
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID", "0")


def _user() -> str:
    return os.environ.get("USER") or str(os.getuid())


def jobs_with_token(token: str) -> list[str]:
    """Ids of this user's queued jobs whose --comment holds `token` (oldest first)."""
    out = run(["squeue", "-h", "-r", "-u", _user(), "-o", "%i|%k"])
    found = [line.split("|", 1)[0] for line in out.splitlines() if "|" in line and token in line.split("|", 1)[1]]
    return sorted(found, key=lambda j: int(j) if j.isdigit() else 0)


def submit(script: Path, token: str, comment: str = "", *, hold: bool = True) -> str:
    """sbatch SCRIPT with `--comment` holding `token` (held unless hold=False); the job id.

    A submission that timed out may have created the job all the same (the controller read the
    request and could not answer), so before sending it again the queue is searched for the
    token; duplicates found afterwards (a stale request processed late) are held, never ran,
    and are cancelled here. Hold the job until its attempt is recorded, then `release` it."""
    tries = 0

    def attempt() -> str:
        nonlocal tries
        if tries:
            found = jobs_with_token(token)
            if found:
                return found[0]
        tries += 1
        argv = ["sbatch", "--parsable", f"--comment={f'{comment} {token}'.strip()}", str(script)]
        if hold:
            argv.insert(2, "--hold")
        out = _once(argv, timeout=60).strip()
        job_id = out.split(";")[0]  # --parsable: "ID" or "ID;CLUSTER"
        if not re.fullmatch(_JOB_ID, job_id):
            raise SlurmError(f"sbatch --parsable printed {out[:200]!r}, not a job id")
        return job_id

    job_id = retrying("sbatch", attempt)
    if tries > 1 and hold:
        for other in jobs_with_token(token):
            if other != job_id:
                scancel(other)
    return job_id


def _after_transient(what: str, cmd: list[str], done: Callable[[], bool]) -> None:
    """Run a command that changes a job; when it fails after an earlier try went unanswered,
    `done()` (asked of the controller) decides whether that earlier try took effect."""
    unanswered = False

    def attempt() -> None:
        nonlocal unanswered
        try:
            _once(cmd, timeout=60)
        except SlurmError as e:
            if e.transient:
                unanswered = True
                raise
            if unanswered and done():
                return
            raise

    retrying(what, attempt)


def release(job_id: str) -> None:
    """Let a held job start."""

    def released() -> bool:
        info = show_job(job_id)
        return info is None or "Held" not in info.reason

    _after_transient("scontrol release", ["scontrol", "release", job_id], released)


def scancel(job_id: str, signal: str | None = None) -> None:
    def gone() -> bool:
        """The cancel took effect: the job left the live states (RunState.live, the one list),
        or is ending (COMPLETING, SIGNALING: Slurm is stopping its processes)."""
        info = show_job(job_id)
        if info is None:
            return True
        state = RunState.parse(info.state)
        return not state.live or state in (RunState.COMPLETING, RunState.SIGNALING)

    cmd = ["scancel", *([f"--signal={signal}"] if signal else []), job_id]
    _after_transient("scancel", cmd, gone if signal is None else lambda: False)


def requeue(job_id: str, restarts_before: int) -> None:
    """Requeue and make it eligible now (Slurm otherwise holds a requeued job for
    cred_expire + 1 s on BeginTime: 121 s by default). A try that went unanswered may have
    requeued it: its restart count then went past `restarts_before`."""

    def requeued() -> bool:
        info = show_job(job_id)
        return info is not None and info.restarts > restarts_before

    _after_transient("scontrol requeue", ["scontrol", "requeue", job_id], requeued)
    try:
        run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], retry_s=0)
    except SlurmError:
        pass  # only a speed-up; the job still starts once BeginTime passes


def hostnames(nodelist: str) -> list[str]:
    return run(["scontrol", "show", "hostnames", nodelist]).split()


def allocation_nodes(environ: Mapping[str, str] | None = None) -> int | None:
    """The node count of the allocation this process runs in, as Slurm gave it
    (SLURM_JOB_NUM_NODES, or SLURM_NNODES of older Slurms): with `--nodes=MIN-MAX` the real one,
    not the job file's range (None outside an allocation)."""
    env = os.environ if environ is None else environ
    value = env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES")
    return int(value) if value and value.isdigit() else None
