"""Why a job waits, when it should start, and what would start it sooner, from Slurm itself:
the reason code squeue gives (said in words), the backfill scheduler's estimate (`squeue --start`;
`sbatch --test-only` for a job not queued yet: `submit --dry-run`), and the partitions' nodes
free now (`sinfo`), never guessed."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from ..core import slurmcli

if TYPE_CHECKING:  # (status imports this module: `runs` and `status` never load the spec)
    from ..core import spec as specmod

# Slurm's pending reasons (squeue %r) a user meets most, in words; others are shown as Slurm says.
REASONS = {
    "Resources": "the nodes it needs are busy; it starts when enough are free",
    "Priority": "jobs of higher priority are ahead of it in the queue",
    "Dependency": "it waits for another job to end (a data prepare array, a previous attempt)",
    "DependencyNeverSatisfied": "the job it depends on failed: it will never start (cancel it)",
    "BeginTime": "it was asked to start later (--begin)",
    "JobHeldUser": "held by its user (scontrol release JOB)",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxGRESPerUser": "your QOS's limit on GPUs per user is reached by your other jobs",
    "QOSMaxJobsPerUserLimit": "your QOS's limit on running jobs per user is reached",
    "QOSMaxNodePerUserLimit": "your QOS's limit on nodes per user is reached",
    "QOSGrpGRES": "the QOS's GPUs are all in use",
    "AssocGrpGRES": "your account's GPU limit is reached",
    "AssocGrpCPUMinutesLimit": "your account's CPU-minutes budget is used up",
    "AssocGrpGRESMinutes": "your account's GPU-minutes budget is used up",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionNodeLimit": "it asks for more nodes than the partition allows",
    "PartitionTimeLimit": "its time limit is over the partition's",
    "PartitionDown": "the partition is down",
    "Reservation": "it waits for its reservation to start",
    "launch failed requeued held": "its launch failed and Slurm held it (scontrol release JOB)",
}


def words(reason: str) -> str:
    """'Resources' -> 'Resources: the nodes it needs are busy; ...'; other reasons as Slurm says them."""
    key = reason.strip().strip("()")
    said = REASONS.get(key)
    return f"{key}: {said}" if said else reason


def expected_start(job_id: str) -> str:
    """The backfill scheduler's start estimate of a pending job ('' when it has none yet: it makes
    one every backfill cycle)."""
    return expected_starts([job_id]).get(job_id, "")


def expected_starts(job_ids: list[str]) -> dict[str, str]:
    """{job id: its start estimate} of pending jobs, from ONE `squeue --start` call (the TUI's
    queue asks for all its pending runs at once); a job without an estimate yet is left out."""
    try:
        out = slurmcli.run(["squeue", "--start", "-h", "-j", ",".join(job_ids), "-o", "%i|%S"], retry_s=0)
    except slurmcli.SlurmError:
        return {}
    found = {}
    for line in out.splitlines():
        job_id, _, when = line.strip().partition("|")
        if when not in ("", "N/A", "Unknown"):
            found[job_id] = when.replace("T", " ")
    return found


_TEST_ONLY = r"to start at (\S+) using (\d+) processors on nodes (\S+) in partition (\S+)"


def would_start(script: Path) -> str:
    """`sbatch --test-only` of a batch script: 'at 2026-11-27 22:05:36 on node[1-2] (partition
    debug)', or why Slurm says it cannot."""
    found, said = _test_only(script)
    if found is None:
        return said
    when, nodes, partition = found
    return f"at {when} on {nodes} (partition {partition})"


def _test_only(script: Path, *options: str) -> tuple[tuple[str, str, str] | None, str]:
    """((start, nodes, partition), '') of `sbatch --test-only [options] script` (options on the
    command line override the script's #SBATCH lines), or (None, what Slurm said instead)."""
    try:  # (it answers on stderr, whatever the outcome: not slurmcli.run's stdout)
        done = subprocess.run(["sbatch", "--test-only", *options, str(script)], capture_output=True, text=True,
                              timeout=30)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"unknown: sbatch --test-only: {e}"
    out = done.stderr + done.stdout
    m = re.search(_TEST_ONLY, out)
    if not m:
        return None, " ".join(out.split())[:200]
    when, _, nodes, partition = m.groups()
    return (when.replace("T", " "), nodes, partition), ""


SHORTER = (2, 4, 8)  # the time limits tried: the job's own divided by these, the longest that helps said


def shorter_time(script: Path, minutes: int, start: str | None = None) -> str:
    """What a shorter `slurm.time` would do, as Slurm itself answers (`sbatch --test-only --time`
    of the job's batch script: the backfill scheduler starts a job early only when it ends before
    the resources are promised to another): '--set slurm.time=30 would start it at ... (Slurm's
    test: backfill), not ...'; '' when no shorter limit tried starts it earlier than `start`
    (Slurm's estimate for the job as it is: squeue --start; None: its own --test-only, where a
    job whose limit runs into a reservation finds no start at all: measured on Slurm 22.05,
    "allocation failure: Requested node configuration is not available") or Slurm could not tell."""
    refused = ""
    if start is None:
        found, refused = _test_only(script)
        start = found[0] if found else ""
    if not start and not refused:
        return ""
    for divisor in SHORTER:
        limit = minutes // divisor
        if limit < 1:
            break
        found, _ = _test_only(script, f"--time={limit}")
        if found is not None and not start:
            return (f"--set slurm.time={limit} would start it at {found[0]} (sbatch --test-only; with its "
                    f"{minutes} min Slurm finds no start: {refused})")  # fmt: skip
        if found is not None and found[0] < start:
            return (f"--set slurm.time={limit} would start it at {found[0]}, not {start} (sbatch --test-only: "
                    "backfill fits a job that ends sooner)")  # fmt: skip
    return ""


def sooner(spec: specmod.JobSpec) -> list[str]:
    """What would start a job of `spec` now, from the nodes free this moment: fewer nodes (the
    global batch kept through grad_accum), or another partition with enough free nodes."""
    try:
        out = slurmcli.run(["sinfo", "-h", "-N", "-o", "%N|%P|%T"], retry_s=0)
    except slurmcli.SlurmError:
        return []
    idle: dict[str, set[str]] = {}
    default = ""
    for line in out.splitlines():
        node, partition, state = ([*line.split("|"), "", ""])[:3]
        if partition.endswith("*"):
            partition = default = partition.rstrip("*")
        idle.setdefault(partition, set())
        if state.rstrip("*~#!%$@^-") == "idle":
            idle[partition].add(node)
    mine = spec.slurm.partition or default
    need = spec.node_range.low  # (a node range starts on its least size)
    tips = []
    free = len(idle.get(mine, ()))
    if 0 < free < need and (accum := spec.grad_accum_at(free)) is not None:
        tips.append(
            f"{free} node(s) of partition {mine} are free now: --set slurm.nodes={free} --set train.grad_accum={accum} "
            "starts now with the same global batch"
        )
    for partition, nodes in sorted(idle.items()):
        if partition != mine and len(nodes) >= need:
            tips.append(f"partition {partition} has {len(nodes)} free node(s) now: --set slurm.partition={partition}")
    return tips
