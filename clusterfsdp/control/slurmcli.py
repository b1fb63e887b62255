"""Thin, typed wrappers over Slurm's client commands (squeue, sacct, scancel, scontrol).

One batched call per question (all job ids at once), plain `-o`/`--parsable2` text
output (stable across Slurm versions, unlike `--json` whose shapes changed between 22.05
and 24.x), and a one-line `SlurmError` instead of a traceback when a command is missing
or the controller is down.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

# Slurm states in which a job still holds or waits for resources.
ACTIVE_STATES = {
    "PENDING",
    "CONFIGURING",
    "RUNNING",
    "COMPLETING",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "RESIZING",
    "SUSPENDED",
    "STAGE_OUT",
    "SIGNALING",
    "PREEMPTED",
}


class SlurmError(RuntimeError):
    pass


@dataclass(frozen=True)
class JobRow:
    job_id: str
    state: str
    reason: str = ""
    elapsed: str = ""
    nodes: str = ""
    exit_code: str = ""


def available() -> bool:
    """sbatch is installed and a controller answers (`scontrol ping`), so a job can be queued."""
    if shutil.which("sbatch") is None or shutil.which("scontrol") is None:
        return False
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0 and "UP" in proc.stdout


def version() -> tuple[int, int] | None:
    """(major, minor) of the installed Slurm (`sbatch --version`: 'slurm 22.05.8'); None if unknown."""
    try:
        words = run(["sbatch", "--version"], timeout=10).split()
        major, minor = words[1].split(".")[:2]
        return int(major), int(minor)
    except (SlurmError, IndexError, ValueError):
        return None


def run(cmd: list[str], timeout: float = 30) -> str:
    """Run a Slurm command; return stdout or raise SlurmError with Slurm's own message."""
    if shutil.which(cmd[0]) is None:
        raise SlurmError(f"{cmd[0]}: command not found (is Slurm installed on this machine?)")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{cmd[0]}: no answer within {timeout:.0f} s (is slurmctld up?)") from None
    if proc.returncode != 0:
        msg = " ".join((proc.stderr or proc.stdout).split()) or f"exit status {proc.returncode}"
        # Slurm's own messages start with the command's name ("squeue: error: ..."): name it once.
        raise SlurmError(msg if msg.startswith(f"{cmd[0]}: ") else f"{cmd[0]}: {msg}")
    return proc.stdout


def squeue(job_ids: list[str] | None = None) -> dict[str, JobRow]:
    """Queued/running jobs: the given ids, or all of the current user's. One call."""
    cmd = ["squeue", "-h", "-o", "%i|%T|%r|%M|%N"]
    if job_ids:
        cmd += ["-j", ",".join(job_ids)]
    else:
        cmd += ["-u", os.environ.get("USER") or str(os.getuid())]
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
        rows[job_id] = JobRow(job_id, state.split()[0] if state else "", reason, elapsed, nodes, code)
    return rows


def job_states(job_ids: list[str]) -> dict[str, JobRow]:
    """squeue for live jobs, sacct for the ones that left the queue; copes with sacct being disabled."""
    rows = squeue(job_ids)
    missing = [j for j in job_ids if j not in rows]
    if missing:
        try:
            rows.update(sacct(missing))
        except SlurmError:
            pass  # accounting disabled: finished jobs are judged from the run folder alone
    return rows


def scancel(job_id: str, signal: str | None = None) -> None:
    run(["scancel", *([f"--signal={signal}"] if signal else []), job_id])


def requeue(job_id: str) -> None:
    """Requeue and make it eligible now (Slurm otherwise holds a requeued job ~2 min on BeginTime)."""
    run(["scontrol", "requeue", job_id])
    try:
        run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
    except SlurmError:
        pass  # only a speed-up; the job still starts once BeginTime passes


def hostnames(nodelist: str) -> list[str]:
    return run(["scontrol", "show", "hostnames", nodelist]).split()
