"""Tests of the local multi-node Slurm (slurm/devcluster.sh) against the real daemons.

`.ci/run` brings the cluster up before pytest (`bash slurm/devcluster.sh up`) and down
after; the `slurm_cluster` fixture brings it up itself when it is not. Nothing here skips:
a missing daemon is a failure.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

# The `slurm_cluster` fixture comes from tests/slurm_fixtures.py, loaded for the whole
# session by conftest.py (`pytest_plugins = ["slurm_fixtures"]`, tests/ on sys.path).
from slurm_fixtures import SCRIPT, SlurmCluster

from clusterfsdp.control import devcluster

slurm = pytest.mark.slurm


# ------------------------------------------------------------------ no cluster needed


def test_script_is_found() -> None:
    assert devcluster.script_path() == SCRIPT
    assert SCRIPT.with_name("slurm.conf.in").is_file()


def test_main_refuses_non_root(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert devcluster.main(["status"]) == 2
    err = capsys.readouterr().err
    assert "must run as root" in err and err.count("\n") == 1


def test_main_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert devcluster.main(["bogus"]) == 2
    assert devcluster.main(["--help"]) == 0
    assert "up | down | status" in capsys.readouterr().out


def test_parse_env_file() -> None:
    text = 'export SLURM_CONF=/x/slurm.conf\nexport CFDC_NODE_NAMES="node1 node2"\n# c\n'
    assert devcluster.parse_env_file(text) == {
        "SLURM_CONF": "/x/slurm.conf",
        "CFDC_NODE_NAMES": "node1 node2",
    }


# ------------------------------------------------------------------ against the cluster


@slurm
def test_status_says_up(slurm_cluster: SlurmCluster) -> None:
    proc = subprocess.run(["bash", str(SCRIPT), "status"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "debug" in proc.stdout
    info = devcluster.read_info(slurm_cluster.state)
    assert info is not None and info.nodes == slurm_cluster.nodes
    assert len(slurm_cluster.nodes) >= 2
    assert slurm_cluster.first_job_id >= 1_000_000


@slurm
def test_srun_two_nodes_distinct_hosts_and_ips(slurm_cluster: SlurmCluster) -> None:
    script = (
        'echo "$(hostname) $(hostname -I) $(getent ahostsv4 "$(hostname)" | head -n1 | cut -d" " -f1) $SLURM_PROCID"'
    )
    out = slurm_cluster.run(["srun", "-N2", "--ntasks-per-node=1", "sh", "-c", script]).stdout
    rows = sorted(line.split() for line in out.splitlines() if line.strip())
    assert [r[0] for r in rows] == ["node1", "node2"], out
    ips = [r[1] for r in rows]
    assert ips == list(slurm_cluster.node_ips[:2]), out
    assert len(set(ips)) == 2
    # each node's own name resolves (per-namespace /etc/hosts) to its bridge IP
    assert [r[2] for r in rows] == ips, out
    assert sorted(r[3] for r in rows) == ["0", "1"]


@slurm
def test_sbatch_two_nodes_completes_in_sacct(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    job = slurm_cluster.sbatch(
        [
            "-N2",
            "--ntasks-per-node=1",
            "--wait",
            "-o",
            str(out),
            "--wrap",
            'echo "nodelist=$SLURM_JOB_NODELIST"; srun hostname',
        ],
        timeout=60,
    )
    assert job >= slurm_cluster.first_job_id
    text = out.read_text()
    assert "nodelist=node[1-2]" in text, text
    assert sorted(text.split()[1:]) == ["node1", "node2"], text
    assert slurm_cluster.wait_sacct(job, "COMPLETED") == "COMPLETED"


@slurm
def test_fake_gpus(slurm_cluster: SlurmCluster) -> None:
    gpus = slurm_cluster.gpus_per_node
    out = slurm_cluster.run(
        ["srun", "-N2", f"--gpus-per-node={gpus}", "sh", "-c", 'echo "$(hostname) $CUDA_VISIBLE_DEVICES"']
    ).stdout
    expected = ",".join(str(i) for i in range(gpus))
    assert sorted(out.split()) == sorted(["node1", "node2", expected, expected]), out
    too_many = slurm_cluster.run(
        ["sbatch", "-N1", "-o", "/dev/null", f"--gpus-per-node={gpus + 1}", "--wrap", "true"], check=False
    )
    assert too_many.returncode != 0
    assert "Requested node configuration is not available" in too_many.stderr


def _live_cmdlines_with(token: str) -> list[list[bytes]]:
    """argv of every live process whose command line contains `token`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline:
            found.append(cmdline.split(b"\0"))
    return found


@slurm
def test_scancel(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    token = f"cfdc-scancel-{uuid.uuid4().hex[:8]}"
    job = slurm_cluster.sbatch(
        ["-N2", "-o", str(tmp_path / "out.txt"), "--wrap", f'srun bash -c "sleep 600; : {token}"']
    )

    # Both tasks are running: their command lines (/usr/bin/bash -c ...) carry the token. srun's
    # two processes carry it too, so only bash counts. Cancelling while a task is still being
    # launched races proctrack/linuxproc: the late task escapes the kill and slurmd drains its
    # node ("Kill task failed"), which broke every later multi-node test in one CI run.
    def tasks() -> list[list[bytes]]:
        return [argv for argv in _live_cmdlines_with(token) if argv[0].rsplit(b"/", 1)[-1] == b"bash"]

    slurm_cluster.wait_for("the job's two tasks", lambda: len(tasks()) == 2, timeout=30)
    assert slurm_cluster.squeue_state(job) == "RUNNING"
    slurm_cluster.run(["scancel", str(job)])
    assert slurm_cluster.wait_sacct(job, "CANCELLED").startswith("CANCELLED")
    slurm_cluster.wait_for("the job's processes to go", lambda: not _live_cmdlines_with(token), timeout=30)


@slurm
def test_requeue_then_start_now(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    """scontrol requeue puts a running job back in the queue; StartTime=now restarts it.

    Every step waits for a state instead of assuming one: under load the node may still be
    busy from an earlier test, the scheduler runs every few seconds, and slurmdbd records
    the requeue asynchronously (sacct lags squeue)."""
    out = tmp_path / "out.txt"
    job = slurm_cluster.sbatch(
        [
            "-N1",
            "--requeue",
            "--open-mode=append",
            "-o",
            str(out),
            "--wrap",
            'echo "run restart=${SLURM_RESTART_COUNT:-0}"; sleep 600',
        ]
    )

    def printed(text: str) -> bool:
        return out.exists() and text in out.read_text()

    def restarted() -> bool:
        # Requeued jobs wait for a begin time (cred_expire + 1 s); StartTime=now lifts it, but
        # only once the job is PENDING again, so it is (re)issued for as long as it pends.
        if slurm_cluster.squeue_state(job) == "PENDING":
            slurm_cluster.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=False)
        return printed("restart=1")

    try:
        slurm_cluster.wait_for("first run", lambda: printed("restart=0"), timeout=120)
        slurm_cluster.run(["scontrol", "requeue", str(job)])
        slurm_cluster.wait_for("second run", restarted, timeout=180, interval=1)
        assert slurm_cluster.squeue_state(job) == "RUNNING"
    finally:
        slurm_cluster.run(["scancel", str(job)], check=False)

    want = ["REQUEUED", "CANCELLED by 0"]
    slurm_cluster.wait_sacct_rows(job, lambda rows: rows == want, " then ".join(want), timeout=60)


@slurm
def test_nonexistent_partition_is_rejected(slurm_cluster: SlurmCluster) -> None:
    proc = slurm_cluster.run(["sbatch", "-p", "no-such-partition", "-o", "/dev/null", "--wrap", "true"], check=False)
    assert proc.returncode != 0
    assert "invalid partition" in proc.stderr.lower(), proc.stderr


@slurm
def test_namespaces_are_isolated(slurm_cluster: SlurmCluster) -> None:
    assert slurm_cluster.netns[0].endswith("ctl") and len(slurm_cluster.netns) == len(slurm_cluster.nodes) + 1
    subnet = slurm_cluster.ctl_ip.rsplit(".", 1)[0] + ".0/24"
    for ns in slurm_cluster.netns:
        default = slurm_cluster.run(["ip", "-n", ns, "route", "show", "default"]).stdout
        assert default.strip() == "", f"{ns} has a default route: {default}"
        routes = slurm_cluster.run(["ip", "-n", ns, "-4", "route", "show"]).stdout.split("\n")
        assert [r.split()[0] for r in routes if r.strip()] == [subnet], routes
        unreachable = slurm_cluster.run(["ip", "-n", ns, "route", "get", "1.1.1.1"], check=False)
        assert unreachable.returncode != 0


@slurm
def test_plain_sbatch_finds_the_cluster(slurm_cluster: SlurmCluster) -> None:
    etc = Path("/etc/slurm/slurm.conf")
    ours = etc.is_file() and "clusterfsdp-devcluster" in etc.read_text().splitlines()[0]
    if etc.exists() and not ours:
        # someone else's slurm.conf: devcluster.sh must have left it alone
        return
    assert ours, "devcluster.sh up should have installed /etc/slurm/slurm.conf"
    assert etc.read_text() == slurm_cluster.slurm_conf.read_text()
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    proc = subprocess.run(["sinfo", "-h", "-o", "%P"], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and proc.stdout.split() == ["debug*"], proc.stdout + proc.stderr
