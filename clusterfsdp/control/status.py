"""A run's state, joined from the run folder (events written by rank 0) and the executor
(squeue/sacct for Slurm, the process group for local runs). Used by `status`, `runs`
and the TUI's queue; Slurm is asked once per refresh for all runs together."""

from __future__ import annotations

from dataclasses import dataclass

from . import launch, runfolder, slurmcli

# Final events written by the worker (rank 0) -> the run state they mean.
_END_STATES = {"completed": "COMPLETED", "failed": "FAILED", "requeued": "REQUEUED", "stopped": "CANCELLED"}


@dataclass
class RunStatus:
    run: runfolder.RunFolder
    state: str
    reason: str = ""
    job_id: str = ""
    executor: str = ""
    step: int | None = None
    steps: int | None = None
    loss: float | None = None
    attempts: int = 0
    eval_loss: float | None = None
    eval_step: int | None = None


@dataclass(frozen=True)
class Progress:
    step: int | None = None
    loss: float | None = None
    eval_step: int | None = None
    eval_loss: float | None = None


def _progress(run: runfolder.RunFolder) -> Progress:
    """The last row's step and loss, and the last evaluation's."""
    rows = run.metrics()
    if not rows:
        return Progress()
    evals = [r for r in rows if r.get("eval_loss") is not None]
    last_eval = evals[-1] if evals else {}
    return Progress(rows[-1].get("step"), rows[-1].get("loss"), last_eval.get("step"), last_eval.get("eval_loss"))


def run_status(run: runfolder.RunFolder, queue: dict[str, slurmcli.JobRow] | None = None) -> RunStatus:
    """State of one run. `queue` is a pre-fetched {job id: row} (see `statuses`)."""
    state_file = run.state()
    attempts = state_file.get("attempts", [])
    progress = _progress(run)
    try:
        steps = run.spec().train.steps
    except Exception:
        steps = None
    st = RunStatus(
        run,
        "PREPARED",
        executor=state_file.get("executor", ""),
        step=progress.step,
        steps=steps,
        loss=progress.loss,
        attempts=len(attempts),
        eval_loss=progress.eval_loss,
        eval_step=progress.eval_step,
    )
    if not attempts:
        st.reason = "not submitted (dry run): sbatch " + str(run.path / "sbatch.sh")
        return st
    last = attempts[-1]
    st.job_id, st.executor = str(last["job_id"]), last["executor"]
    events = [e for e in run.events() if str(e.get("job_id")) == st.job_id]
    end = next((e for e in reversed(events) if e.get("event") in _END_STATES), None)
    started = any(e.get("event") == "start" for e in events)
    if last["executor"] == "slurm":
        row = (queue or {}).get(st.job_id)
        if queue is None:
            try:
                row = slurmcli.job_states([st.job_id]).get(st.job_id)
            except slurmcli.SlurmError as e:
                st.reason = str(e)
        if row is not None and row.state in slurmcli.ACTIVE_STATES:
            st.state, st.reason = row.state, ("" if row.reason in ("None", "") else row.reason)
            return st
        if row is not None and row.state not in ("COMPLETED",) and not (end and end["event"] == "completed"):
            st.state = row.state
            st.reason = _reason(end, row)
            return st
    elif launch.local_job_alive(last):
        st.state = "RUNNING" if started else "PENDING"
        return st
    if end is not None:
        st.state = _END_STATES[end["event"]]
        st.reason = end.get("reason", "")
    elif last.get("cancelled"):
        st.state = "CANCELLED"
    elif started:
        st.state, st.reason = "FAILED", "workers exited without a final record (killed?); see `clusterfsdp logs`"
    else:
        st.state, st.reason = (
            ("FAILED", "never started; see the submitit logs")
            if last["executor"] == "local"
            else ("UNKNOWN", st.reason)
        )
    return st


def _reason(end: dict | None, row: slurmcli.JobRow) -> str:
    parts = []
    if end is not None and end.get("reason"):
        parts.append(end["reason"])
    if row.exit_code and row.exit_code != "0:0":
        parts.append(f"exit code {row.exit_code}")
    if row.reason and row.reason not in ("None", ""):
        parts.append(row.reason)
    if row.state == "NODE_FAIL":
        parts.append(f"a node failed ({row.nodes})")
    return "; ".join(parts)


def statuses(run_list: list[runfolder.RunFolder]) -> tuple[list[RunStatus], str]:
    """Status of many runs with one squeue (+ one sacct) call; returns (rows, Slurm error or '')."""
    ids = [str(r.attempts[-1]["job_id"]) for r in run_list if r.attempts and r.attempts[-1]["executor"] == "slurm"]
    queue: dict[str, slurmcli.JobRow] = {}
    error = ""
    if ids:
        try:
            queue = slurmcli.job_states(ids)
        except slurmcli.SlurmError as e:
            error = str(e)
    return [run_status(r, queue) for r in run_list], error
