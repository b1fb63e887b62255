"""What runs cost where runs are listed (issue 39 item 2): the COST column of `runs`, a line per
user, `status RUN`, `status SWEEP` (each point and all together) and their `--json`, from ONE
sacct call for every attempt shown, and no call at all for attempts whose figures the run folder
keeps (cost.json, written only in your own folder, read only when no one else could have written
it). sacct missing or failing: the cost is `?`, never a traceback.

Slurm's commands are shell stubs on PATH here (squeue lists nothing: every job has ended; sacct
answers the state query and the cost query as Slurm 22.05 does, and logs each call): the one
boundary this machine's real Slurm cannot be made to show on demand (thousands of settled jobs,
an accounting outage). The figures against a real sacct are in test_slurm_e2e."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tui_helpers import make_run

from clusterfsdp.control import cost, status
from clusterfsdp.control.sweepfolder import SweepFolder
from clusterfsdp.core.records import Event, EventKind, Executor, SweepPoint, SweepRecord

# Every job: 2 fake GPUs and 4 CPUs for 1800 s (1.00 GPU-h, 2.00 CPU-h); job 2002 also an earlier
# incarnation of 900 s that was requeued.
SACCT = r"""#!/bin/bash
echo "sacct $*" >> "$CALLS"
[ -e "$FAKE_DOWN" ] && { echo "sacct: error: Problem talking to the database: Connection refused" >&2; exit 1; }
ids=$(echo "$*" | sed -n 's/.*-j \([^ ]*\).*/\1/p' | tr , ' ')
for id in $ids; do
  case "$*" in
    *AllocTRES*)
      [ "$id" = 2002 ] && echo "$id|billing=4,cpu=4,gres/gpu=2,mem=1G,node=1|900|REQUEUED"
      echo "$id|billing=4,cpu=4,gres/gpu=2,mem=1G,node=1|1800|COMPLETED";;
    *) echo "$id|COMPLETED|None|00:30:00|node1|0:0";;
  esac
done
"""


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "clusterfsdp", *args], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


@pytest.fixture
def slurm_stubs(tmp_path: Path) -> dict[str, str]:
    """An environment whose squeue and sacct are the stubs; `CALLS` logs each call."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "sacct").write_text(SACCT)
    squeue = '#!/bin/bash\necho "squeue $*" >> "$CALLS"\n[ -e "$QUEUE" ] && cat "$QUEUE"\nexit 0\n'
    (bindir / "squeue").write_text(squeue)
    for tool in ("sacct", "squeue"):
        (bindir / tool).chmod(0o755)
    for tool in ("bash", "sed", "tr", "cat"):  # what the stubs run; nothing of this machine's real Slurm
        (bindir / tool).symlink_to(shutil.which(tool) or tool)
    return {**os.environ, "PATH": str(bindir), "CALLS": str(tmp_path / "calls"), "FAKE_DOWN": str(tmp_path / "down"),
            "QUEUE": str(tmp_path / "queue"), "CLUSTERFSDP_SLURM_RETRY_S": "0"}  # fmt: skip


def cost_calls(env: dict[str, str]) -> list[str]:
    calls = Path(env["CALLS"])
    return [c for c in calls.read_text().splitlines() if "AllocTRES" in c] if calls.exists() else []


def test_runs_lists_what_each_run_cost_with_one_sacct_call_then_none(tmp_path, slurm_stubs):
    """Three finished Slurm runs and a local one: `runs` asks sacct once for the three (their
    GPU-hours in the COST column, a line per user), keeps the settled figures in each run folder,
    and the next `runs` asks sacct nothing for them. `--json` carries the same figures."""
    root = tmp_path / "runs"
    for i, job in enumerate(("2001", "2002", "2003")):
        make_run(root, f"20260101-12000{i}-aaaa", executor="slurm", job_id=job)
    make_run(root, "20260101-120009-aaaa", job_id="local1")
    r = cli("runs", "--run-root", str(root), env=slurm_stubs)
    assert r.returncode == 0, r.stderr
    (call,) = cost_calls(slurm_stubs)
    assert call.endswith("-j 2001,2002,2003"), call
    lines = {line.split()[0]: line for line in r.stdout.splitlines()}
    assert " 1.00 GPU-h " in lines["20260101-120000-aaaa"] and " 1.50 GPU-h " in lines["20260101-120001-aaaa"]
    assert " - " in lines["20260101-120009-aaaa"]  # a local run: no Slurm accounting
    me = status.owner(status.RunFolder(root / "tiny-cpu" / "20260101-120000-aaaa"))
    assert f"cost       {me}: 3.50 GPU-h, 7.00 CPU-h (3 run(s))" in r.stdout, r.stdout
    cached = json.loads((root / "tiny-cpu" / "20260101-120001-aaaa" / cost.CACHE_FILE).read_text())
    assert cached["jobs"] == {"2002": [[1800.0, 3600.0], [3600.0, 7200.0]]}
    again = cli("runs", "--run-root", str(root), "--json", env=slurm_stubs)
    assert again.returncode == 0 and len(cost_calls(slurm_stubs)) == 1, cost_calls(slurm_stubs)
    doc = json.loads(again.stdout)
    by_id = {row["run_id"]: row for row in doc["runs"]}
    assert by_id["20260101-120001-aaaa"]["cost"]["gpu_hours"] == 1.5
    assert by_id["20260101-120001-aaaa"]["cost"]["attempts"] == {"2002": {"gpu_hours": 1.5, "cpu_hours": 3.0}}
    assert by_id["20260101-120009-aaaa"]["cost"] is None
    assert doc["cost_by_user"] == {me: {"gpu_hours": 3.5, "cpu_hours": 7.0, "runs": 3, "unknown": 0}}


def test_sacct_missing_or_failing_shows_a_question_mark_not_a_traceback(tmp_path, slurm_stubs):
    """sacct failing (accounting down) and sacct absent: the run is listed, its cost `?`, one
    warning line on stderr; `status RUN` says the cost is unknown and why; exit 0."""
    root = tmp_path / "runs"
    run = make_run(root, executor="slurm", job_id="2001")
    Path(slurm_stubs["FAKE_DOWN"]).touch()
    r = cli("runs", "--run-root", str(root), env=slurm_stubs)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert r.stdout.splitlines()[1].split()[5] == "?", r.stdout
    assert "warning: cost unknown (?): sacct: error: Problem talking to the database" in r.stderr
    st = cli("status", str(run.path), env=slurm_stubs)
    assert st.returncode == 0 and "cost       unknown: sacct: error: Problem talking" in st.stdout, st.stdout
    (Path(slurm_stubs["PATH"]) / "sacct").unlink()
    r = cli("runs", "--run-root", str(root), "--json", env=slurm_stubs)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    (row,) = json.loads(r.stdout)["runs"]
    assert row["cost"] is None and row["cost_error"].startswith("sacct: command not found"), row
    assert not (run.path / cost.CACHE_FILE).exists()


def test_another_users_figures_are_never_trusted_nor_written(tmp_path, slurm_stubs, other_user, shared_root):
    """A shared run root: another user's run carries a cost.json claiming 999 GPU-h and one of
    your own runs a world-writable one. Neither is believed (sacct's figures are shown), the other
    user's folder is never written (this suite runs as root, which could), yours is replaced
    by the real figures; a cost line per user, and `--user NAME` lists only NAME's runs."""
    mine = make_run(shared_root, "20260101-120000-aaaa", executor="slurm", job_id="2001")
    planted = {"schema": 1, "jobs": {"2003": [[999 * 3600.0, 0.0]]}}
    theirs_src = make_run(tmp_path / "src", "20260101-120001-bbbb", name="theirs", executor="slurm", job_id="2003")
    (theirs_src.path / cost.CACHE_FILE).write_text(json.dumps(planted))
    theirs = other_user.plant_copy(theirs_src.path.parent, shared_root) / theirs_src.id
    (mine.path / cost.CACHE_FILE).write_text(json.dumps(planted | {"jobs": {"2001": [[999 * 3600.0, 0.0]]}}))
    (mine.path / cost.CACHE_FILE).chmod(0o666)
    r = cli("runs", "--run-root", str(shared_root), env=slurm_stubs)
    assert r.returncode == 0, r.stderr
    assert "999" not in r.stdout and r.stdout.count(" 1.00 GPU-h ") == 2, r.stdout
    me = status.owner(mine)
    assert f"cost       {other_user.name}: 1.00 GPU-h, 2.00 CPU-h (1 run(s))" in r.stdout
    assert f"cost       {me}: 1.00 GPU-h, 2.00 CPU-h (1 run(s))" in r.stdout
    assert json.loads((theirs / cost.CACHE_FILE).read_text()) == planted  # not written
    assert json.loads((mine.path / cost.CACHE_FILE).read_text())["jobs"] == {"2001": [[3600.0, 7200.0]]}
    only = cli("runs", "--run-root", str(shared_root), "--user", other_user.name, env=slurm_stubs)
    assert "theirs" in only.stdout and mine.id not in only.stdout and f"cost       {me}" not in only.stdout


def test_a_job_that_waits_and_never_ran_is_not_asked(tmp_path, slurm_stubs):
    """A run whose job Slurm lists as PENDING and whose workers never started has used nothing:
    `runs` shows 0 and asks sacct nothing; once its workers started, it is asked."""
    root = tmp_path / "runs"
    run = make_run(root, executor="slurm", job_id="2005", end=None)
    run.events_file.write_text("")  # queued, never started
    Path(slurm_stubs["QUEUE"]).write_text("2005|PENDING|Resources|0:00|\n")
    r = cli("runs", "--run-root", str(root), env=slurm_stubs)
    assert r.returncode == 0 and r.stdout.splitlines()[1].split()[2:6:3] == ["PENDING", "0"], r.stdout
    assert cost_calls(slurm_stubs) == []
    run.append_event(Event(EventKind.START, "2005", 0, 0, "node1", 0.0))
    Path(slurm_stubs["QUEUE"]).write_text("2005|RUNNING|None|1:00|node1\n")
    r = cli("runs", "--run-root", str(root), env=slurm_stubs)
    assert len(cost_calls(slurm_stubs)) == 1 and " 1.00 GPU-h " in r.stdout, r.stdout
    assert not (run.path / cost.CACHE_FILE).exists()  # a live job's figures grow: never kept


def test_a_sweep_shows_each_points_cost_and_all_together(tmp_path, slurm_stubs):
    """`status SWEEP`: a COST cell per point and the points together (and in `--json`); `runs`:
    the sweep's line says what it cost. One sacct call for both points' array tasks."""
    root = tmp_path / "runs"
    points = [SweepPoint(i, f"ab-p{i}", {"train.lr": lr}) for i, lr in enumerate((3e-3, 1e-3))]
    for p in points:
        make_run(root, p.run_id, name="tiny-swab", executor="slurm", job_id=f"3000_{p.index}")
    SweepFolder(root / "tiny-swab").write_record(SweepRecord("swab", "tiny", Executor.SLURM, 1.0, ["train.lr"], points))
    r = cli("status", "swab", "--run-root", str(root), env=slurm_stubs)
    assert r.returncode == 0, r.stderr
    (call,) = cost_calls(slurm_stubs)
    assert call.endswith("-j 3000_0,3000_1"), call
    rows = [line for line in r.stdout.splitlines() if line.startswith(("0 ", "1 "))]
    assert len(rows) == 2 and all(line.endswith(" 1.00 GPU-h") for line in rows), r.stdout
    assert "cost       2.00 GPU-h, 4.00 CPU-h, all points together" in r.stdout
    doc = json.loads(cli("status", "swab", "--run-root", str(root), "--json", env=slurm_stubs).stdout)
    assert doc["cost"] == {"gpu_hours": 2.0, "cpu_hours": 4.0, "unknown_points": 0}
    assert [p["cost"]["gpu_hours"] for p in doc["points"]] == [1.0, 1.0]
    listed = cli("runs", "--run-root", str(root), env=slurm_stubs)
    assert "sweep of 2 (train.lr): 2 COMPLETED; best loss 2.5000" in listed.stdout, listed.stdout
    assert "; cost 2.00 GPU-h\n" in listed.stdout
