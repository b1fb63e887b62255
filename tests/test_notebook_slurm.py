"""clusterfsdp.notebook inside a real Slurm allocation (the devcluster: node1, node2, partition
debug). Each notebook runs in a kernel started under `salloc -N2 ...`, so the kernel inherits the
allocation's environment exactly as a Jupyter kernel inside salloc (or Open OnDemand) does: the
runner is tests/test_notebook.py executed as a script. The session fixture `slurm_cluster`
(tests/slurm_fixtures.py) makes sure the cluster is up and gives its SLURM_CONF and partition."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_notebook import RESULT_CELL, errors, json_line, kernel_env, make_notebook, run_notebook, stream_text

pytestmark = pytest.mark.slurm
REPO = Path(__file__).resolve().parents[1]


def slurm_env(cluster) -> dict[str, str]:
    """A login shell's environment on the devcluster: no job variables, the cluster's SLURM_CONF."""
    return kernel_env(SLURM_CONF=str(cluster.slurm_conf))


def run_in_allocation(
    cluster, tmp_path: Path, nb, salloc_args: list[str], *, interrupt: tuple[int, str] | None = None, timeout: int = 540
):
    """Execute `nb` with a kernel that runs inside `salloc -N2 <salloc_args>`; returns (nb, report)."""
    import nbformat

    src, dst, rep = tmp_path / "in.ipynb", tmp_path / "out.ipynb", tmp_path / "report.json"
    nbformat.write(nb, src)
    cmd = [
        "salloc",
        "-N2",
        "-p",
        cluster.partition,
        "--time=15",
        "--job-name=nbtest",
        *salloc_args,
        sys.executable,
        str(REPO / "tests" / "test_notebook.py"),
        str(src),
        str(dst),
        str(rep),
        "--cwd",
        str(tmp_path),
    ]
    if interrupt:
        cmd += ["--interrupt", str(interrupt[0]), interrupt[1]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=slurm_env(cluster), cwd=tmp_path)
    assert rep.is_file(), proc.stdout + proc.stderr
    report = json.loads(rep.read_text())
    assert "error" not in report and proc.returncode == 0, (report, proc.stdout[-3000:], proc.stderr[-3000:])
    assert re.search(rf"Granted job allocation {report['slurm_job_id']}", proc.stderr), proc.stderr
    return nbformat.read(dst, as_version=4), report


_CLUSTER: list = []


@pytest.fixture(autouse=True)
def _cluster(slurm_cluster):
    assert slurm_cluster.partition == "debug" and slurm_cluster.nodes[:2] == ("node1", "node2"), slurm_cluster
    _CLUSTER[:] = [slurm_cluster]
    return slurm_cluster


def cli(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=slurm_env(_CLUSTER[0]),
    )
    return out.stdout + out.stderr


def test_srun_trains_on_two_nodes_from_a_notebook_in_salloc(slurm_cluster, tiny_job, tmp_path):
    job = str(tiny_job)
    nb = make_notebook(
        [
            "import os\nfrom clusterfsdp.notebook import srun\nprint('ALLOC', os.environ['SLURM_JOB_ID'])",
            f"r = srun({job!r}, nodes=2, gpus_per_node=2, all_ranks=True, overrides={{'train.steps': 30}})",
            RESULT_CELL,
            f"%load_ext clusterfsdp\nm = %clusterfsdp srun {job} --nodes 2 --set train.steps=10\n"
            "print('MAGIC', m.status, m.step, ','.join(sorted(set(m.hosts.values()))))",
            # Slurm removes a finished step asynchronously (epilog, accounting): give it 60 s
            "import subprocess, time\nfor _ in range(60):\n"
            "    steps = subprocess.run(['squeue', '--steps', '-h', '-j', os.environ['SLURM_JOB_ID'], "
            "'-o', '%i|%j'], capture_output=True, text=True).stdout\n"
            "    if 'clusterfsdp-nb' not in steps:\n        break\n    time.sleep(1)\n"
            "print('STEPS', repr(steps))",
        ]
    )
    nb, report = run_in_allocation(slurm_cluster, tmp_path, nb, ["--ntasks-per-node=2", "--gpus-per-node=2"])
    alloc = report["slurm_job_id"]
    out = stream_text(nb.cells[1])
    assert f"launcher: srun into allocation {alloc} (nodes node[1-2])" in out, out
    # rank-prefixed progress from both nodes (all ranks requested)
    for rank, host in ((0, "node1"), (1, "node1"), (2, "node2"), (3, "node2")):
        for step in (10, 20, 30):
            assert re.search(rf"^\[rank{rank} {host}\] step {step}/30 loss \d", out, re.M), (rank, step, out)
    r = json_line(nb.cells[2])
    assert r["status"] == "completed" and r["launcher"] == "srun", r
    assert r["job_id"] == alloc and re.fullmatch(rf"{alloc}\.\d+", r["step"]), r
    assert r["hosts"] == {"0": "node1", "1": "node1", "2": "node2", "3": "node2"}
    assert r["exit_codes"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    assert r["steps"] == [10, 20, 30] and r["checkpoint"].endswith("step-00000030")

    run_dir = Path(r["run_dir"])
    state = json.loads((run_dir / "state.json").read_text())
    (attempt,) = state["attempts"]
    assert state["executor"] == "srun" and attempt["executor"] == "srun" and attempt["job_id"] == alloc
    assert attempt["step"] == r["step"] and attempt["step_name"].startswith("clusterfsdp-nb-")
    assert attempt["exit_codes"] == {"0": 0, "1": 0, "2": 0, "3": 0}
    key = f"{alloc}.0"
    assert sorted(p.name for p in (run_dir / "logs" / key).iterdir()) == [f"rank{i}.log" for i in range(4)]
    assert "step 30/30" in (run_dir / "logs" / key / "rank3.log").read_text()
    for host in ("node1", "node2"):
        record = json.loads((run_dir / "nodes" / key / f"{host}.json").read_text())
        assert record["dist"]["world_size"] == 4 and record["dist"]["num_nodes"] == 2
        assert record["cuda_visible_devices"] == "0,1"  # --gpus-per-node=2 restated on the srun line
    events = [e for e in (json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines())]
    assert {e["event"] for e in events} >= {"start", "completed"} and all(e["job_id"] == alloc for e in events)
    assert "state      COMPLETED" in cli("status", str(run_dir))
    assert run_dir.name in cli("runs", "--run-root", str(tmp_path / "runs"))
    assert "step 30/30" in cli("logs", str(run_dir), "--rank", "2")

    magic = stream_text(nb.cells[3])
    m = re.search(rf"MAGIC completed ({alloc}\.\d+) node1,node2", magic)
    assert m and m.group(1) != r["step"], magic  # a second step of the same allocation
    assert re.search(r"^\[rank0 node1\] step 10/10", magic, re.M) and "[rank2 " not in magic  # rank 0 by default
    assert "clusterfsdp-nb" not in stream_text(nb.cells[4])
    print(f"2-node notebook in salloc: {report['total_s']:.1f} s")


def test_stop_button_cancels_the_step_in_salloc(slurm_cluster, tiny_job, tmp_path):
    job = str(tiny_job)
    nb = make_notebook(
        [
            "import os, subprocess\nfrom clusterfsdp.notebook import srun",
            (f"srun({job!r}, nodes=2, overrides={{'train.steps': 100000}})", ["raises-exception"]),
            RESULT_CELL,
            "print('STEPS', repr(subprocess.run(['squeue', '--steps', '-h', '-j', os.environ['SLURM_JOB_ID'], '-o', "
            "'%i|%j'], capture_output=True, text=True).stdout))",
            "print('ANSWER', 6 * 7)",
        ]
    )
    nb, report = run_in_allocation(
        slurm_cluster, tmp_path, nb, ["--ntasks-per-node=2"], interrupt=(1, r"step 20/100000")
    )
    cell = nb.cells[1]
    (err,) = errors(cell)
    assert err["ename"] == "StepInterrupted", err
    out = stream_text(cell)
    m = re.search(r"interrupted: srun step (\S+) cancelled with (SIGTERM|SIGKILL), all 4 ranks gone (\d+\.\d) s", out)
    assert m, out
    step, how, gone_s = m.group(1), m.group(2), float(m.group(3))
    # right after the cell returned: no step of ours in `squeue --steps`, no rank process on any node
    assert step not in report["squeue_steps_after"] and "clusterfsdp-nb" not in report["squeue_steps_after"], report
    assert report["procs_after"] == [], report["procs_after"]
    r = json_line(nb.cells[2])
    assert r["status"] == "interrupted" and r["step"] == step
    # within the grace period the ranks stopped at a step boundary and saved (docs/notebooks.md "Stopping")
    saved = re.search(r"; saved step (\d+): ", out)
    assert how == "SIGTERM" and saved and r["exit_codes"] == {"0": 0, "1": 0, "2": 0, "3": 0}, (out, r)
    assert r["checkpoint"].endswith(f"step-{int(saved.group(1)):08d}"), r
    assert "clusterfsdp-nb" not in stream_text(nb.cells[3])
    assert "ANSWER 42" in stream_text(nb.cells[4])  # the kernel still answers
    assert "state      CANCELLED" in cli("status", r["run_dir"])
    print(
        f"srun interrupt: {how}, all 4 ranks gone {gone_s:.1f} s after the interrupt (measured in the kernel); "
        f"cell returned {report['interrupt_to_cell_done_s']:.1f} s after the interrupt"
    )


def test_outside_allocation_error_with_a_real_controller(slurm_cluster, tiny_job, tmp_path):
    job = str(tiny_job)
    nb = make_notebook(
        [
            (f"from clusterfsdp.notebook import srun\nsrun({job!r})", ["raises-exception"]),
            "print('ANSWER', 6 * 7)",
        ]
    )
    nb, _ = run_notebook(nb, tmp_path, slurm_env(slurm_cluster))
    (err,) = errors(nb.cells[0])
    text = "\n".join(err["traceback"])
    assert err["ename"] == "NotInAllocation" and "a Slurm controller answers" in text
    assert "salloc" in text and "clusterfsdp.submit(" in text
    assert "ANSWER 42" in stream_text(nb.cells[1]) and not (tmp_path / "runs").exists()
