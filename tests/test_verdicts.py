"""One verdict per failed attempt: `status`'s state and attempt lines, `--follow`'s last line,
`doctor`, `logs` and the TUI (queue and run screen) all name the same first cause, the cause
first and the rank that died before the ranks that lost it.

Two real runs of jobs/tiny-cpu.toml through `clusterfsdp submit --executor local --follow`
(submitit's local executor, two gloo ranks), made side by side by one module-scoped fixture: in
one, rank 1 is killed with SIGKILL in training, as `kill -9` of a user (or the OOM killer)
does; the other reads a JSONL file broken after its first record (validate reads only the first).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from procs import CORPUS
from test_doctor import _broken_jsonl

from clusterfsdp import cli
from clusterfsdp.control import doctor, status
from clusterfsdp.control.doctor import Finding
from clusterfsdp.core import runfolder

REPO = Path(__file__).resolve().parents[1]
KILLED = "rank 1 died without an exception (signal 9 (SIGKILL): kill -9, or the OOM killer)"


def _follow(job: Path, root: Path, *sets: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "clusterfsdp", "submit", str(job), "--executor", "local", "--follow"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    for item in sets:
        argv += ["--set", item]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=root)


def _heartbeat(root: Path, name: str, rank: int) -> dict:
    """Rank `rank`'s heartbeat in the run of job `name` under `root` ({} before it wrote one)."""
    for path in root.glob(f"{name}/*/health/*/rank{rank}.json"):
        try:
            return json.loads(path.read_text())
        except ValueError:  # being replaced
            return {}
    return {}


@pytest.fixture(scope="module")
def ended(tmp_path_factory) -> dict[str, tuple[runfolder.RunFolder, str, str]]:
    """{'killed' | 'data': (run folder, --follow's stdout, --follow's stderr)}, both runs under
    one run root (the jobs' names are `killed` and `data`)."""
    base = tmp_path_factory.mktemp("verdicts")
    root = base / "runs"
    text = (REPO / "jobs" / "tiny-cpu.toml").read_text().replace('run_root = "../runs"', f'run_root = "{root}"')
    jobs = {}
    for name, data in (("killed", CORPUS), ("data", _broken_jsonl(base))):
        jobs[name] = base / f"{name}.toml"
        jobs[name].write_text(text.replace('"data/corpus.txt"', f'"{data}"').replace('"tiny-cpu"', f'"{name}"'))
    killed = _follow(jobs["killed"], base, "train.steps=2000", "train.log_every=1")
    data = _follow(jobs["data"], base)
    deadline = time.monotonic() + 600
    while _heartbeat(root, "killed", 1).get("step", 0) < 2:  # rank 1 trains: its peer waits for it in every step
        assert killed.poll() is None and time.monotonic() < deadline, "rank 1 never got to step 2"
        time.sleep(0.5)
    os.kill(_heartbeat(root, "killed", 1)["pid"], signal.SIGKILL)
    out = {}
    for name, proc in (("killed", killed), ("data", data)):
        stdout, stderr = proc.communicate(timeout=600)
        (run,) = [r for r in runfolder.list_runs(root) if r.name == name]
        out[name] = (run, stdout, stderr)
    return out


def test_one_verdict_for_a_killed_rank_the_dead_rank_first(ended, capsys):
    """`--follow`'s last line, `status`'s state and attempt lines and `doctor` all say rank 1 was
    killed (the signal from the local controller's record), not rank 0's lost connection."""
    run, _, stderr = ended["killed"]
    d = doctor.diagnose(run)
    assert d.finding is Finding.RANK_KILLED and d.rank == 1 and d.summary.startswith(KILLED), d
    verdict = d.headline()
    assert stderr.rstrip().splitlines()[-1] == f"run {run.id}: FAILED - {verdict}", stderr
    assert cli.main(["status", str(run.path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert f"state      FAILED - {verdict}" in lines, lines
    assert f"  ended    (restart 0) failed (rank_killed): {verdict}" in lines, lines
    assert f"cause      rank_killed: {d.summary}" in lines
    assert not any("Connection" in line for line in lines if line.startswith(("state", "  ended"))), lines
    assert cli.main(["doctor", str(run.path)]) == 0
    shown = capsys.readouterr().out
    assert f"cause      rank_killed: {KILLED}" in shown and "then       rank 0 on " in shown


def test_logs_of_a_killed_rank_point_at_its_submitit_task_log(ended, capsys):
    """Rank 1 died before it wrote a line to its own log: `logs --rank 1` shows submitit's log of
    its task instead of "empty so far", and why it ended."""
    run, _, _ = ended["killed"]
    job_id = run.record().last.job_id
    assert cli.main(["logs", str(run.path), "--rank", "1"]) == 0
    said = capsys.readouterr()
    assert f"rank 1 wrote nothing to its log ({run.log_path(job_id, 0, 1)})" in said.err, said.err
    assert f"submitit/{job_id}/{job_id}_1_log." in said.err and "empty so far" not in said.err
    assert f"rank_killed: {KILLED}" in said.err and said.out.strip(), said


def test_a_failed_follow_prints_the_traceback_once_and_ends_with_the_verdict(ended):
    """A one-line DataError: the rank's traceback once (not again with `[rank0]:` before each
    line), and the last line the same verdict as `status`: the cause first, then the rank."""
    run, stdout, stderr = ended["data"]
    assert stdout.count("Traceback (most recent call last):") == 1, stdout
    assert "[rank0]: Traceback" not in stdout and "[rank1]: Traceback" not in stdout
    st = status.run_status(run)
    assert st.reason.startswith("DataError: data.paths[0]: ") and ":21: not valid JSON" in st.reason, st.reason
    assert stderr.rstrip().splitlines()[-1] == f"run {run.id}: FAILED - {st.reason}"
    assert st.reason == doctor.diagnose(run).headline()


def test_the_tui_shows_the_same_cause_as_status(ended, tmp_path, monkeypatch):
    """The queue's REASON column starts with the cause (not `rank 1 on HOST:`, which cut it off),
    and the run screen's attempts say how the attempt ended as `status` does (a Textual pilot)."""
    from textual.widgets import DataTable
    from tui_helpers import FakeSlurm, open_run_screen, rendered, run_app, select, until

    from clusterfsdp.tui.app import ClusterApp

    monkeypatch.chdir(tmp_path)
    app = ClusterApp(ended["killed"][0].path.parents[1], slurm=FakeSlurm(), refresh_s=3600)
    killed, data = (status.run_status(ended[name][0]).reason for name in ("killed", "data"))

    async def scenario(pilot):
        await until(pilot, lambda: len(app.rows) == 2, "the two runs")
        table = app.screen.query_one(DataTable)
        reasons = {str(table.get_row_at(i)[0]): str(table.get_row_at(i)[-1]) for i in range(table.row_count)}
        for name, reason in (("killed", killed), ("data", data)):
            shown = reasons[ended[name][0].id].rstrip("…")
            assert shown and reason.startswith(shown) and not re.match(r"rank \d+ on ", shown), (shown, reason)
        assert reasons[ended["killed"][0].id].startswith("rank 1 died without an exception")
        assert reasons[ended["data"][0].id].startswith("DataError: ")
        await select(pilot, app, str(ended["killed"][0].path))
        screen = await open_run_screen(pilot, app)
        await until(
            pilot, lambda: "cause      rank_killed:" in rendered(screen.query_one("#run-header")), "the verdict"
        )
        header = rendered(screen.query_one("#run-header"))
        assert "FAILED - rank 1 died without an exception" in header
        assert "-> failed (rank_killed)" in str(screen.query_one("#checkpoints", DataTable).border_subtitle)

    run_app(app, scenario)
