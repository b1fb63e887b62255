"""The queue: the user's Slurm jobs joined with the run folders, gathered in one worker call.

One refresh is one `squeue -u $USER` (all of the user's jobs, so jobs submitted by other tools
show too), one `sinfo` for the partitions' free nodes and GPUs (the Cluster screen), plus, only
for runs whose job has left the queue, one `sacct`. Each run's state is then
`status.run_status` with that pre-fetched table, so it is the same state `clusterfsdp status`
prints, and a finished run still appears (from its run folder, and sacct if enabled). What each
run cost is one more `sacct` for all of them (`status.with_costs`: none for the attempts whose
figures their run folders keep), and the start estimate of the runs that wait one
`squeue --start` for all of them (`pending.expected_starts`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from clusterfsdp.control import cost, pending, status
from clusterfsdp.control.partitions import Partition, query_partitions
from clusterfsdp.core import runfolder, slurmcli
from clusterfsdp.core.records import Executor, RunState
from clusterfsdp.core.term import printable

# squeue's own fields plus name and partition, which slurmcli.squeue does not ask for.
SQUEUE_FORMAT = "%i|%T|%r|%M|%N|%j|%P"


@dataclass(frozen=True)
class QueuedJob:
    row: slurmcli.JobRow
    name: str = ""
    partition: str = ""


class SlurmCommands:
    """The Slurm commands the TUI runs, in one place so tests can hand the app a fake cluster."""

    def available(self) -> bool:
        return slurmcli.available()

    def queue(self) -> dict[str, QueuedJob]:
        """All of the user's queued and running jobs, with one squeue call."""
        user = os.environ.get("USER") or str(os.getuid())
        out = slurmcli.run(["squeue", "-h", "-u", user, "-o", SQUEUE_FORMAT])
        jobs = {}
        for line in out.splitlines():
            job_id, state, reason, elapsed, nodes, name, partition = (line.split("|") + [""] * 7)[:7]
            jobs[job_id] = QueuedJob(slurmcli.JobRow(job_id, state, reason, elapsed, nodes), name, partition)
        return jobs

    def accounting(self, job_ids: list[str]) -> dict[str, slurmcli.JobRow]:
        return slurmcli.sacct(job_ids)

    def usage(self, job_ids: Iterable[str]) -> dict[str, cost.Accounted]:
        """What the jobs used, incarnation by incarnation (one sacct call)."""
        return cost.accounting(job_ids)

    def expected_starts(self, job_ids: list[str]) -> dict[str, str]:
        """The backfill scheduler's start estimates of pending jobs (one squeue --start call)."""
        return pending.expected_starts(job_ids)

    def partitions(self) -> list[Partition]:
        """Every partition's nodes, GPUs and CPUs by state, with one sinfo call."""
        return query_partitions()

    def cancel(self, job_id: str) -> None:
        slurmcli.scancel(job_id)


@dataclass(frozen=True)
class QueueRow:
    """One line of the queue: a run folder, or a Slurm job that has none."""

    key: str  # the run folder, or "job:<id>": stable across refreshes and resumes
    run: runfolder.RunFolder | None
    name: str
    state: str
    reason: str = ""
    job_id: str = ""
    executor: str = ""
    step: str = ""
    loss: str = ""
    attempts: int = 0
    cost: str = ""  # '1.25 GPU-h', '-' (no Slurm attempt), '?' (sacct could not tell)
    spent: str = ""  # the cost in full: per kind, and what restarts redid (`RunCost.line`), or why unknown
    expected: str = ""  # a pending run: when Slurm's backfill scheduler expects it to start

    @property
    def job(self) -> str:
        return f"{self.executor}:{self.job_id}" if self.job_id else "-"

    @property
    def label(self) -> str:
        """The run's id (or the job's), as the screens show it: printable, one line."""
        return printable(self.run.id if self.run else f"job {self.job_id}", lines=False)


def _run_status(run: runfolder.RunFolder, table: dict[str, slurmcli.JobRow]) -> status.RunStatus | QueueRow:
    try:
        return status.run_status(run, table)
    except (OSError, KeyError, ValueError) as e:  # a hand-edited or half-copied run folder
        return QueueRow(str(run.path), run, run.name, "UNREADABLE", f"{type(e).__name__}: {e}")


def _run_row(st: status.RunStatus, starts: dict[str, str]) -> QueueRow:
    spent = st.cost.line() if st.cost is not None else f"unknown: {st.cost_error}" if st.cost_error else ""
    return QueueRow(
        str(st.run.path),
        st.run,
        st.run.name,
        st.state,
        st.reason,
        st.job_id,
        st.executor,
        f"{st.step or 0}/{st.steps or '?'}",
        f"{st.loss:.4f}" if st.loss is not None else "-",
        len(st.attempts),
        cost.cell(st.cost, st.on_slurm),
        spent,
        starts.get(st.job_id, "") if st.state is RunState.PENDING else "",
    )


def _unasked(error: str) -> cost.Ask:
    """While squeue fails, sacct is not asked (it would only wait out the same outage): costs
    not kept in the run folders are unknown."""

    def ask(job_ids: Iterable[str]) -> dict[str, cost.Accounted]:
        raise slurmcli.SlurmError(f"not asked while Slurm does not answer ({error})")

    return ask


def _numeric(job_id: str) -> list[int]:
    """Sort key for ids like '123' and '123_4' (array tasks) in numeric order."""
    return [int(part) for part in re.findall(r"\d+", job_id)]


@dataclass(frozen=True)
class Refresh:
    """What one refresh gathered: the queue's rows, the partitions, and what failed."""

    rows: list[QueueRow]
    partitions: list[Partition] | None  # None: sinfo was not asked (Slurm down) or failed
    error: str = ""  # squeue's error: Slurm is down or missing
    cluster_error: str = ""  # sinfo's error, when squeue answered


def collect(run_root: Path, slurm: SlurmCommands, limit: int = 200) -> Refresh:
    """The newest `limit` runs, then the user's other Slurm jobs; and the partitions."""
    found = runfolder.list_runs(run_root)[:limit]
    error = cluster_error = ""
    try:
        queue = slurm.queue()
    except slurmcli.SlurmError as e:
        queue, error = {}, str(e)
    cluster = None
    if not error:  # a controller that squeue cannot reach would only fail sinfo the same way
        try:
            cluster = slurm.partitions()
        except slurmcli.SlurmError as e:
            cluster_error = str(e)
    table = {job_id: job.row for job_id, job in queue.items()}
    attempts = {run: run.attempts for run in found}
    finished = [
        tries[-1].job_id
        for tries in attempts.values()
        if tries and tries[-1].executor is Executor.SLURM and tries[-1].job_id not in table
    ]
    if finished and not error:
        try:
            table.update(slurm.accounting(finished))
        except slurmcli.SlurmError:
            pass  # accounting disabled: those runs are judged from their folders
    read = [_run_status(run, table) for run in found]
    runs = [st for st in read if isinstance(st, status.RunStatus)]
    status.with_costs(runs, slurm.usage if not error else _unasked(error))
    waiting = [st.job_id for st in runs if st.state is RunState.PENDING and st.executor == Executor.SLURM and st.job_id]
    starts = slurm.expected_starts(waiting) if waiting and not error else {}
    rows = [_run_row(st, starts) if isinstance(st, status.RunStatus) else st for st in read]
    owned = {a.job_id for tries in attempts.values() for a in tries}
    for job_id in sorted(set(queue) - owned, key=_numeric, reverse=True):
        job = queue[job_id]
        facts = [
            pending.words(job.row.reason) if job.row.reason not in ("None", "") else "",
            f"partition {job.partition}" if job.partition else "",
            f"{job.row.elapsed} elapsed" if job.row.elapsed else "",
        ]
        rows.append(
            QueueRow(
                f"job:{job_id}",
                None,
                job.name,
                job.row.state,
                ", ".join(x for x in facts if x),
                job_id,
                "slurm",
                "-",
                "-",
                1,
            )
        )
    return Refresh(rows, cluster, error, cluster_error)
