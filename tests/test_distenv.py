"""From Slurm's environment to ranks: hostlists (against the real `scontrol`), ranks, ports, interfaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import procs
import pytest

from clusterfsdp.worker import distenv, threads

HOSTLISTS = [
    "node1",
    "node[1-3]",
    "gpu[001-004,010],cpu7",
    "a[1-2]b[3-4]",
    "x[9-11]",
    "rack[1-2]-gpu[01-02]",
    "login,gpu[1,3,5-6]",
]


@pytest.mark.parametrize("hostlist", HOSTLISTS)
def test_hostlist_agrees_with_scontrol(hostlist):
    expected = subprocess.run(
        ["scontrol", "show", "hostnames", hostlist], capture_output=True, text=True, check=True
    ).stdout.split()
    assert distenv.expand_hostlist(hostlist) == expected


def test_hostlist_examples():
    assert distenv.expand_hostlist("gpu[001-003,010],cpu7") == ["gpu001", "gpu002", "gpu003", "gpu010", "cpu7"]
    with pytest.raises(ValueError):
        distenv.expand_hostlist("gpu[1-")


def test_tasks_per_node_forms():
    assert distenv.tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert distenv.tasks_per_node("4") == [4]


def slurm_env(**kw: str) -> dict[str, str]:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "8",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NODELIST": "gpu[007-008,012-013]",
        "SLURM_TASKS_PER_NODE": "2(x4)",
        "SUBMITIT_EXECUTOR": "slurm",
    }
    env.update(kw)
    return env


def test_ranks_from_slurm():
    d = distenv.from_environ(slurm_env())
    assert (d.rank, d.local_rank, d.world_size, d.local_world_size, d.node_rank, d.num_nodes) == (5, 1, 8, 2, 1, 4)
    assert d.master_addr == "gpu007" and d.launcher == "slurm" and 15000 <= d.master_port <= 65535


def test_port_is_stable_across_ranks_and_changes_with_requeue_and_step():
    ports = {distenv.from_environ(slurm_env(SLURM_PROCID=str(r))).master_port for r in range(8)}
    assert len(ports) == 1
    assert distenv.from_environ(slurm_env(SLURM_RESTART_COUNT="1")).master_port not in ports
    assert distenv.from_environ(slurm_env(SLURM_STEP_ID="3")).master_port not in ports
    assert distenv.from_environ(slurm_env(MASTER_PORT="31337")).master_port == 31337


def test_job_step_nodelist_wins_over_the_allocation():
    d = distenv.from_environ(
        slurm_env(SLURM_STEP_NODELIST="gpu[012-013]", SLURM_STEP_NUM_TASKS="4", SLURM_STEP_TASKS_PER_NODE="2(x2)")
    )
    assert d.master_addr == "gpu012" and d.world_size == 4 and d.num_nodes == 2


def test_oci_container_ranks_come_from_the_hostname(monkeypatch):
    """Inside `srun --container` Slurm 22.05 leaves the batch step's SLURM_PROCID=0 (or none): one
    task per node, the rank is the host's place in the step's nodes; a container with its own
    hostname gets a clear error instead of two rank 0s waiting on each other."""
    import socket

    oci = {"SLURM_CONTAINER": "/shared/bundle", "SLURM_STEP_NODELIST": "gpu[012-013]", "SLURM_STEP_NUM_TASKS": "2",
           "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "0", "SLURM_NODEID": "0"}  # fmt: skip
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu013.cluster.example")
    d = distenv.from_environ(slurm_env(**oci))
    assert (d.rank, d.local_rank, d.node_rank, d.world_size, d.master_addr) == (1, 0, 1, 2, "gpu012")
    env = slurm_env(**oci)
    del env["SLURM_PROCID"], env["SUBMITIT_EXECUTOR"]
    assert distenv.from_environ(env).rank == 1
    monkeypatch.setattr(socket, "gethostname", lambda: "runc")
    with pytest.raises(RuntimeError, match="'uts' namespace"):
        distenv.from_environ(env)


def test_an_oci_task_gets_its_own_task_numbers_before_submitit_reads_them(tmp_path):
    """`python -m clusterfsdp.worker.ocitask -u -m MODULE ARGS` (what each srun task runs inside an
    OCI container) sets SLURM_PROCID/NODEID/LOCALID to the node's place in the step (this host is
    the second node here) over the batch step's zeros, then runs MODULE with ARGS as `python -m`;
    outside a container, and with several tasks per node, it leaves them alone."""
    import socket

    (tmp_path / "showtask.py").write_text(
        "import json, os, sys\nprint(json.dumps([sys.argv[1:], [os.environ.get(k) for k in "
        "('SLURM_PROCID', 'SLURM_NODEID', 'SLURM_LOCALID')], __name__]))\n"
    )
    here = socket.gethostname().split(".")[0]
    step = {"SLURM_STEP_NODELIST": f"zz-other,{here}", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "0",
            "SLURM_NODEID": "0", "SLURM_LOCALID": "0", "PYTHONPATH": str(tmp_path)}  # fmt: skip
    argv = [sys.executable, "-u", "-m", "clusterfsdp.worker.ocitask", "-u", "-m", "showtask", "FOLDER/%j"]

    def seen(extra: dict[str, str]) -> list:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | step | extra
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    assert seen({"SLURM_CONTAINER": "/shared/bundle"}) == [["FOLDER/%j"], ["1", "1", "0"], "__main__"]
    assert seen({})[1] == ["0", "0", "0"]
    assert seen({"SLURM_CONTAINER": "/b", "SLURM_STEP_TASKS_PER_NODE": "2(x2)"})[1] == ["0", "0", "0"]


def test_submitit_local_and_single():
    d = distenv.from_environ(
        {
            "SUBMITIT_EXECUTOR": "local",
            "SUBMITIT_LOCAL_NTASKS": "2",
            "SUBMITIT_LOCAL_GLOBALID": "1",
            "SUBMITIT_LOCAL_LOCALID": "1",
            "SUBMITIT_LOCAL_JOB_ID": "77",
        }
    )
    assert (d.rank, d.world_size, d.master_addr, d.launcher) == (1, 2, "127.0.0.1", "submitit-local")
    assert distenv.from_environ({}).world_size == 1


def test_network_env_precedence_and_loopback_refusal():
    d = distenv.from_environ(slurm_env(SLURM_JOB_NODELIST="localhost,other", SLURM_TASKS_PER_NODE="1(x2)"))
    with pytest.raises(RuntimeError, match="loopback"):
        distenv.network_env(d, {}, environ={})
    single = distenv.from_environ({})
    chosen, _ = distenv.network_env(
        single, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}, environ={"PYTORCH_ALLOC_CONF": "mine"}
    )
    assert chosen["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"  # [env] wins over everything
    assert "PYTORCH_ALLOC_CONF" not in chosen  # the user's environment wins over defaults
    assert "CUDA_DEVICE_MAX_CONNECTIONS" not in chosen


def test_route_interface_finds_the_address_that_reaches_the_master():
    iface, ip = distenv.route_interface("127.0.0.1")
    assert iface == "lo" and ip == "127.0.0.1"
    addrs = distenv.interface_addresses()
    assert addrs.get("lo") == "127.0.0.1"


def test_infiniband_hcas_reads_sysfs_layout(tmp_path):
    """A fake /sys/class/infiniband tree (no InfiniBand hardware here)."""
    for dev, state in [("mlx5_0", "4: ACTIVE"), ("mlx5_1", "1: DOWN")]:
        (tmp_path / dev / "ports" / "1").mkdir(parents=True)
        (tmp_path / dev / "ports" / "1" / "state").write_text(state)
    assert distenv.infiniband_hcas(str(tmp_path)) == ["mlx5_0"]


def test_each_rank_gets_its_share_of_the_cpus_it_shares():
    """torch's intra-op threads per rank (worker/threads.py): the ranks on one machine that share
    its CPUs divide them (the local executor, Slurm without CPU binding, the devcluster's nodes
    on one VM: same boot id, other hostnames); Slurm-bound tasks and other machines do not count."""
    cpus = frozenset(range(16))
    local = [("boot-a", range(16))] * 4
    assert threads.share(cpus, "boot-a", local) == (4, 4)
    bound = [("boot-a", range(i * 4, i * 4 + 4)) for i in range(4)]  # --cpus-per-task=4, bound
    assert threads.share(frozenset(range(4)), "boot-a", bound) == (4, 1)
    nodes = [("boot-a", range(16)), ("boot-b", range(16))]  # two real nodes, one rank each
    assert threads.share(cpus, "boot-a", nodes) == (16, 1)
    assert threads.share(frozenset({0, 1}), "boot-a", [("boot-a", [0, 1])] * 3) == (1, 3)  # never 0


def test_derived_master_ports_stay_outside_the_kernels_ephemeral_ports(tmp_path):
    """Issue 40: the master port came from 20000-59999, mostly the kernel's ephemeral ports, which
    any outgoing connection on the node may hold when the master binds. Ports are now derived
    outside net.ipv4.ip_local_port_range (all of 15000-65535 only where it leaves too few)."""
    setting = tmp_path / "ip_local_port_range"
    setting.write_text("32768\t60999\n")
    ephemeral = distenv.ephemeral_ports(setting)
    ports = {distenv.derive_port(str(job), restart, ephemeral=ephemeral) for job in range(3000) for restart in (0, 1)}
    assert len(ports) > 3000 and all(15000 <= p < 32768 or 61000 <= p <= 65535 for p in ports)
    assert any(p >= 61000 for p in ports)  # both sides of the range are used
    assert 15000 <= distenv.derive_port("4242", 0, ephemeral=(1024, 65535)) <= 65535  # nothing outside: any
    lo, hi = distenv.ephemeral_ports()  # this machine's setting, as the ranks read it
    assert not lo <= distenv.from_environ(slurm_env()).master_port <= hi


def test_ports_picked_for_local_launches_are_free_and_outside_the_ephemeral_range():
    """Issue 36: the test launcher (tests/procs.free_port) and the notebook's local supervisor took
    their master port from bind(port 0), i.e. from the kernel's ephemeral range, where an outgoing
    connection may take it before rank 0 binds it. They now pick a free port outside that range."""
    lo, hi = distenv.ephemeral_ports()
    for pick in (procs.free_port, distenv.free_master_port):
        ports = [pick() for _ in range(20)]
        assert all(not lo <= p <= hi and not distenv.port_taken(p) for p in ports), (lo, hi, ports)


def test_a_master_port_another_process_holds_stops_rank_0_with_what_to_set(tmp_path):
    """A real rank of the local executor whose derived master port another process listens on
    stops at once with one line naming the port and the [env] MASTER_PORT to set (before: torch's
    EADDRINUSE, while other ranks could join the foreign listener); with that MASTER_PORT set in
    [env] the same job trains, and the node record in the run folder holds the port it used."""
    import json
    import re
    import socket
    import subprocess
    import sys

    from procs import make_run

    job = """
[job]
name = "port"
[model]
preset = "llama-tiny"
[data]
seq_len = 16
[train]
steps = 1
micro_batch_size = 1
[slurm]
tasks_per_node = 1
preflight = false
[fsdp]
mixed_precision = "fp32"
"""
    local = {"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_NTASKS": "1", "SUBMITIT_LOCAL_GLOBALID": "0",
             "SUBMITIT_LOCAL_LOCALID": "0", "SUBMITIT_LOCAL_JOB_ID": f"port{tmp_path.stat().st_ino}"}  # fmt: skip
    env = {**os.environ, **local, "OMP_NUM_THREADS": "1"}
    port = distenv.from_environ(local).master_port

    def worker(run) -> subprocess.CompletedProcess:
        argv = [sys.executable, "-m", "clusterfsdp.worker", str(run.path)]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)

    held = make_run(job, tmp_path / "a")
    with socket.socket() as other:
        other.bind(("127.0.0.1", port))
        other.listen()
        done = worker(held)
    assert done.returncode != 0
    message = re.search(
        rf"master port {port} on {re.escape(socket.gethostname())} is in use by another process: set "
        r'MASTER_PORT = "(\d+)" in the job\'s \[env\] \(a free port outside the kernel\'s ephemeral ports \d+-\d+\), '
        r"or submit again \(the port follows the job id\)",
        done.stderr,
    )
    assert message, done.stderr[-3000:]
    (failed,) = [e for e in held.events() if e.event.value == "failed"]
    assert message[0] in failed.reason
    free = message[1]
    run = make_run(job, tmp_path / "b", [f"env.MASTER_PORT={free!r}"])
    done = worker(run)
    assert done.returncode == 0, done.stderr[-3000:]
    (record,) = run.nodes_dir.rglob("*.json")
    assert json.loads(record.read_text())["dist"]["master_port"] == int(free)


def test_gpu_default_group_carries_the_cpu_control_collectives_over_gloo():
    """The admission verdict, the local restart count, stop flags and eval totals are CPU
    tensors; an NCCL-only default group refuses them ("No backend type associated with device
    type cpu"), which stopped every GPU run at `_admit` (found on an H200, 2026-11-28,
    bench/results/2026-11-28-fused-h200.txt is the run after the fix). Boundary: the CPU build of
    torch has no NCCL, so only the backend string is checked here; bench/device_run.sh runs it."""
    from clusterfsdp.worker.rank import group_backends

    assert group_backends("nccl") == "cpu:gloo,cuda:nccl"
    assert group_backends("gloo") == "gloo"
