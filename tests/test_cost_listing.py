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
from clusterfsdp.control.records import Event, EventKind, Executor, SweepPoint, SweepRecord
from clusterfsdp.control.sweepfolder import SweepFolder

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
    (bindir / "squeue").write_text('#!/bin/bash\necho "squeue $*" >> "$CALLS"\n')
    for tool in ("sacct", "squeue"):
        (bindir / tool).chmod(0o755)
    for tool in ("bash", "sed", "tr"):  # what the stubs run; nothing of this machine's real Slurm
        (bindir / tool).symlink_to(shutil.which(tool) or tool)
    return {**os.environ, "PATH": str(bindir), "CALLS": str(tmp_path / "calls"), "FAKE_DOWN": str(tmp_path / "down"),
            "CLUSTERFSDP_SLURM_RETRY_S": "0"}  # fmt: skip


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
