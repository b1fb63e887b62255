"""The pre-flight (worker/preflight.py, issue 27 item 2): the checks on their own, then two real
worker processes whose node fails it (the test hook makes its checkpoint folder look full), and
what the control plane makes of that (outcomes, doctor, status).

The GPU check is the one boundary that cannot exist here (no GPU on the test machines): its
logic is tested with a fake probe; `TorchGpus` itself is untested. Everything else is real: real
sockets (a listening one, a closed port, the loopback interface), real free space, real
checkpoint folders, real torch.distributed ranks (gloo)."""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest
from procs import launch, make_run, tiny_job_toml, wait

from clusterfsdp.control import doctor, status
from clusterfsdp.core import ckptfolder, outcomes, records
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Cause, EventKind, Executor
from clusterfsdp.worker import distenv, preflight
from clusterfsdp.worker.preflight import GIB, Check, NodeReport


class FakeGpus:
    """A stand-in for CUDA (no GPU here): `errors` maps a device index to the error it raises."""

    def __init__(self, visible: int, errors: dict[int, str] | None = None, cuda: bool = True):
        self.visible, self.errors, self.cuda = visible, errors or {}, cuda

    def cuda_build(self) -> bool:
        return self.cuda

    def count(self) -> int:
        return self.visible

    def use(self, index: int) -> str:
        return self.errors.get(index, "")


def test_gpu_check_counts_visible_devices_and_names_an_unusable_one(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert preflight.check_gpus(0, FakeGpus(0)) == Check("gpus", True, "none asked for")
    fewer = preflight.check_gpus(4, FakeGpus(2))
    assert not fewer.ok and fewer.detail == "2 visible, 4 asked for (CUDA_VISIBLE_DEVICES=0,1)"
    broken = preflight.check_gpus(2, FakeGpus(2, {1: "AcceleratorError: CUDA error: uncorrectable ECC error"}))
    assert not broken.ok and broken.detail == "cuda:1: AcceleratorError: CUDA error: uncorrectable ECC error"
    assert preflight.check_gpus(2, FakeGpus(2)) == Check("gpus", True, "2 visible and usable")
    cpu_torch = preflight.check_gpus(2, FakeGpus(0, cuda=False))  # the devcluster's fake GPUs
    assert cpu_torch.ok and cpu_torch.detail.startswith("not checked: torch is a CPU build")


def _checkpoint(root: Path, step: int, size: int) -> None:
    path = ckptfolder.step_dir(root, step)
    path.mkdir(parents=True)
    (path / ckptfolder.DCP_METADATA).write_bytes(b"m")
    (path / ckptfolder.COMPLETE).write_text("{}")
    (path / "__0_0.distcp").write_bytes(b"x" * size)


def test_free_space_needs_the_floor_or_the_newest_checkpoint_and_the_hook_fills_one_host(tmp_path, monkeypatch):
    spec = make_run(tiny_job_toml("space", 0, 1), tmp_path).spec()
    ckpt = tmp_path / "ckpt"
    assert preflight.checkpoint_bytes(ckpt) is None  # before the first save: the floor only
    _checkpoint(ckpt, 10, 1000)
    _checkpoint(ckpt, 20, 5000)
    assert preflight.checkpoint_bytes(ckpt) == 5000 + 1 + 2  # the newest one, every file
    floor = preflight.check_space("checkpoint space", ckpt, GIB, 2.0, 5000, "slurm.preflight_free_gb")
    assert not floor.ok and floor.detail == f"{ckpt} has 1.00 GiB free, needs 2.00 GiB (slurm.preflight_free_gb)"
    big = preflight.check_space("checkpoint space", ckpt, 3 * GIB, 1.0, 4 * GIB, "slurm.preflight_free_gb")
    assert not big.ok and "needs 4.00 GiB (the newest checkpoint's size)" in big.detail
    real = shutil.disk_usage(tmp_path).free
    assert preflight.free_bytes(tmp_path / "not" / "yet", "node1") == pytest.approx(real, rel=0.01)
    monkeypatch.setenv(preflight.ENV_TEST_FULL, "node2")
    assert preflight.free_bytes(tmp_path, "node2") == 0 and preflight.free_bytes(tmp_path, "node1") > 0
    checks = preflight.space_checks(spec, ckpt, "node2", 0.5)
    assert [(c.name, c.ok) for c in checks] == [("checkpoint space", False), ("/dev/shm", True)]  # shm: unaffected


def test_interfaces_chosen_for_nccl_and_gloo():
    addresses = {"lo": "127.0.0.1", "eth0": "10.0.0.5", "ib0": "10.1.0.5"}
    pick = preflight.chosen_interfaces
    assert pick({}, addresses) == {}
    assert pick({"GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "=ib0"}, addresses) == {
        "GLOO_SOCKET_IFNAME": "eth0", "NCCL_SOCKET_IFNAME": "ib0"}  # fmt: skip
    assert pick({"NCCL_SOCKET_IFNAME": "ib,eth"}, addresses) == {"NCCL_SOCKET_IFNAME": "ib0"}  # a prefix
    assert pick({"NCCL_SOCKET_IFNAME": "^docker,lo"}, addresses) == {}  # exclusions name nothing to check
    assert pick({"GLOO_SOCKET_IFNAME": "eth1", "NCCL_SOCKET_IFNAME": "=eth"}, addresses) == {
        "GLOO_SOCKET_IFNAME": None, "NCCL_SOCKET_IFNAME": None}  # fmt: skip


def test_network_check_connects_from_the_chosen_interface_to_the_master():
    """Real TCP on the loopback interface: a listening master passes, a closed port and an
    interface this machine does not have fail with the reason."""
    addresses = distenv.interface_addresses()
    assert addresses.get("lo") == "127.0.0.1"
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        env = distenv.DistEnv(0, 0, 2, 1, 0, 2, "127.0.0.1", port, "j", 0, "torchrun")
        ok = preflight.check_network(env, {"GLOO_SOCKET_IFNAME": "lo"}, addresses, preflight.connect)
        assert ok == Check("network", True, f"master 127.0.0.1:{port} reached via lo (127.0.0.1)")
        missing = preflight.check_network(env, {"NCCL_SOCKET_IFNAME": "=nosuch0"}, addresses, preflight.connect)
        assert missing == Check("network", False, "no such interface here: NCCL_SOCKET_IFNAME==nosuch0")
    closed = preflight.check_network(env, {}, addresses, preflight.connect)  # the server is gone
    refused = f"cannot reach the master 127.0.0.1:{port} from this node: Connection refused"
    assert closed == Check("network", False, refused)


def test_the_verdict_names_each_failed_node_and_the_summary_the_slowest():
    good = NodeReport("node1", [Check("gpus", True, "none asked for")], busbw_gbps=2.5)
    slow = NodeReport("node3", [Check("gpus", True, "none asked for")], busbw_gbps=0.4)
    bad = NodeReport("node2", [Check("gpus", True, "x"), Check("checkpoint space", False, "/c has 0.00 GiB free")])
    assert preflight.verdict([good, slow]) is None
    failed = preflight.verdict([good, bad])
    assert failed is not None and failed.nodes == ["node2"]
    assert str(failed) == "pre-flight failed on node2: checkpoint space: /c has 0.00 GiB free"
    line = preflight.summary([good, slow], 4)
    assert line.startswith("pre-flight: 2 node(s) passed (gpus)")
    assert line.endswith("bus bandwidth GB/s: node1 2.50, node3 0.40; slowest node3")
    assert preflight.bus_bandwidth(8 << 20, 0.01, 2) == pytest.approx((8 << 20) / 0.01 / 1e9)
    assert type(failed).__name__ == records.PREFLIGHT_ERROR  # how the control plane finds the line in a reason


def test_a_node_that_fails_stops_both_ranks_and_is_named_everywhere(tmp_path):
    """Two real gloo ranks on this host, whose checkpoint folder the test hook makes look full:
    both ranks stop before step 1 with the same line, each records it (cause preflight, the node in
    failed_nodes), the node record keeps every check; the batch script's classification, the
    doctor and status name the node and why. With slurm.preflight = false the same node trains."""
    host = socket.gethostname()
    run = make_run(tiny_job_toml("preflight", 0, 2), tmp_path)
    run.add_attempt("pf", Executor.LOCAL, "submit")
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 2, "pf", {preflight.ENV_TEST_FULL: host}))
    assert all(code != 0 for code, _ in out), out
    line = f"pre-flight failed on {host}: checkpoint space: {run.checkpoints_dir()} has 0.00 GiB free"
    assert line in (run.logs_dir / "pf.0" / "rank0.log").read_text()
    failed = [e for e in run.events() if e.event is EventKind.FAILED]
    assert sorted(e.rank for e in failed) == [0, 1] and not any(e.event is EventKind.START for e in run.events())
    assert all(e.cause is Cause.PREFLIGHT and e.failed_nodes == [host] for e in failed)
    record = json.loads(run.node_record("pf", 0, host).read_text())["preflight"]
    assert (record["passed"], record["failed_nodes"], record["busbw_gbps"]) == (False, [host], None)
    assert [(c["name"], c["ok"]) for c in record["checks"]] == [
        ("gpus", True), ("checkpoint space", False), ("/dev/shm", True), ("network", True)]  # fmt: skip

    failure = outcomes.classify_failure(run.events(), world_size=2, down_nodes=[], srun_rc=1)
    assert failure.cause is Cause.PREFLIGHT and failure.failed_nodes == (host,) and failure.cause.retryable
    assert failure.detail.startswith(line)
    d = doctor.diagnose(run)
    assert d.finding is doctor.Finding.PREFLIGHT and d.host == host and d.summary.startswith(line), d
    assert status.run_status(run).notes == [failure.detail]

    spec = run.spec()  # slurm.preflight = false: the same node trains (the hook is still set)
    spec.slurm.preflight = False
    run.job_toml.write_text(S.dumps(spec))
    out = wait(launch(["-m", "clusterfsdp.worker", str(run.path)], 2, "off", {preflight.ENV_TEST_FULL: host}))
    assert all(code == 0 for code, _ in out), out
    assert "preflight" not in json.loads(run.node_record("off", 0, host).read_text())
    assert [e.event for e in run.events() if e.job_id == "off" and e.rank == 0][-1] is EventKind.COMPLETED


def test_the_thresholds_are_checked_by_validate():
    with pytest.raises(S.SpecError, match=r"slurm.preflight_free_gb: must be >= 0, found -1.0"):
        S.loads("[slurm]\npreflight_free_gb = -1.0\n")
    assert not S.loads("[slurm]\npreflight = false\n").slurm.preflight
