"""Pre-flight: before step 1 of every attempt, each node checks what training needs, records it
in its node record (`nodes/<job>.<restart>/<host>.json`, key `preflight`), and a node that fails
stops the attempt with one line naming it and why, so that the batch script's job step submits
the next attempt without it (`control.outcomes.classify_failure`, cause `preflight`, budgeted by
slurm.max_restarts like any restart; docs/recovery.md). `slurm.preflight = false` skips it.

The checks, on each node's first rank:
- GPUs: as many visible as slurm.gpus_per_node asks, and each one runs a small kernel;
- free space where checkpoints go (slurm.preflight_free_gb, or the newest checkpoint's size when
  larger: the next save writes a whole new one before the oldest is pruned) and in /dev/shm
  (slurm.preflight_shm_gb, or with checkpoint.async_mode = "process" this node's share of the
  newest checkpoint: the saver processes' staging buffers are shared memory);
- network: every interface chosen for NCCL/gloo (`distenv.network_env`, or the user's) has an
  IPv4 address, and a TCP connection from that address reaches the master (its rendezvous store,
  which rank 0 serves once the process group is up).
Then every rank takes part in a short all-reduce; each node records the bus bandwidth its ranks
measured (nccl-tests' definition: algorithm bandwidth x 2(n-1)/n) and rank 0 logs the slowest.

The checks run after the process group is up: its gather is how every rank learns the verdict
(a rank that stopped alone would leave the others waiting for the collective timeout). A node
whose network is broken enough that the group cannot form fails there, as before (`collective`).

Test hook: with $CLUSTERFSDP_PREFLIGHT_TEST_FULL set to a host name (e.g. through `[env]`), the
pre-flight on that host reports 0 bytes free where checkpoints go, as if its disk were full. It is
read here only and changes nothing else (tests/test_preflight.py, the devcluster test).

torch is imported inside the functions that need it; the checks themselves are plain Python,
and the GPU check takes a probe so that its logic is tested without a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ..core import ckptfolder
from ..core.runfolder import RunFolder
from ..core.spec import JobSpec
from . import distenv
from .attempt import PreflightFailed

ENV_TEST_FULL = "CLUSTERFSDP_PREFLIGHT_TEST_FULL"
SHM = Path("/dev/shm")
GIB = 1 << 30
ALLREDUCE_BYTES = 8 << 20  # per rank: big enough to measure bandwidth, short on any network
ALLREDUCE_ITERS = 5
CONNECT_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Check:
    name: str  # gpus | checkpoint space | /dev/shm | network
    ok: bool
    detail: str


@dataclass
class NodeReport:
    """One node's pre-flight, as its node record keeps it."""

    host: str
    checks: list[Check] = field(default_factory=list)
    busbw_gbps: float | None = None  # the slowest of its ranks; None for a single rank

    @property
    def problem(self) -> str:
        """'' when every check passed, else the failed checks in one line."""
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.ok)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------- GPUs
class GpuProbe(Protocol):
    def cuda_build(self) -> bool:
        """Whether torch was built with CUDA (a CPU build runs every rank on CPU, GPUs or not)."""
        ...

    def count(self) -> int: ...

    def use(self, index: int) -> str:
        """'' when a small kernel ran on the device, else the error."""
        ...


class TorchGpus:
    """The real probe (CUDA). Untested here: no GPU on the test machines; `check_gpus`'s logic
    is tested with a fake probe."""

    def cuda_build(self) -> bool:
        return torch.version.cuda is not None

    def count(self) -> int:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def use(self, index: int) -> str:
        try:
            x = torch.ones(256, 256, device=f"cuda:{index}")
            value = float((x @ x).sum())  # a kernel, and a copy back that waits for it
            return "" if value == 256.0**3 else f"a 256x256 matmul gave {value}"
        except Exception as e:  # an ECC error, a device that fell off the bus, a busy GPU in exclusive mode
            return " ".join(f"{type(e).__name__}: {e}".split())[:200]


def check_gpus(expected: int, probe: GpuProbe) -> Check:
    """`expected` GPUs visible (slurm.gpus_per_node; 0: a CPU job, nothing to check) and each usable."""
    if expected <= 0:
        return Check("gpus", True, "none asked for")
    if not probe.cuda_build():  # e.g. the devcluster's fake GPUs: the ranks train on CPU by design
        return Check("gpus", True, f"not checked: torch is a CPU build ({expected} asked for; the ranks use CPU)")
    visible = probe.count()
    if visible < expected:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "unset")
        return Check("gpus", False, f"{visible} visible, {expected} asked for (CUDA_VISIBLE_DEVICES={cvd})")
    broken = [f"cuda:{i}: {err}" for i in range(visible) if (err := probe.use(i))]
    if broken:
        return Check("gpus", False, "; ".join(broken))
    return Check("gpus", True, f"{visible} visible and usable")


# ---------------------------------------------------------------- free space
def free_bytes(path: Path, host: str, environ: Mapping[str, str] | None = None) -> int:
    """Free bytes on the file system of `path` (or of its nearest existing parent); 0 on the
    host the test hook names (only for the checkpoint folder: see `space_checks`)."""
    if (os.environ if environ is None else environ).get(ENV_TEST_FULL) == host:
        return 0
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def checkpoint_bytes(root: Path) -> int | None:
    """The size of the newest complete checkpoint under `root`; None before the first save."""
    newest = ckptfolder.find(root)
    if newest is None:
        return None
    return sum(p.stat().st_size for p in newest.path.rglob("*") if p.is_file())


def check_space(name: str, path: Path, free: int, floor_gb: float, estimate: int | None, key: str) -> Check:
    """`free` bytes at `path` against max(floor, estimate)."""
    need = max(int(floor_gb * GIB), estimate or 0)
    why = key if need == int(floor_gb * GIB) else "the newest checkpoint's size"
    text = f"{path} has {free / GIB:.2f} GiB free, needs {need / GIB:.2f} GiB ({why})"
    return Check(name, free >= need, text)


def space_checks(spec: JobSpec, ckpt_dir: Path, host: str, node_share: float) -> list[Check]:
    """Where checkpoints go and /dev/shm; `node_share` is this node's fraction of the ranks."""
    size = checkpoint_bytes(ckpt_dir)
    s, c = spec.slurm, spec.checkpoint
    shm_estimate = int(size * node_share) if size and c.async_ and c.async_mode == "process" else None
    checks = [
        check_space("checkpoint space", ckpt_dir, free_bytes(ckpt_dir, host), s.preflight_free_gb, size,
                    "slurm.preflight_free_gb"),
    ]  # fmt: skip
    if SHM.is_dir():
        checks.append(check_space("/dev/shm", SHM, free_bytes(SHM, "", {}), s.preflight_shm_gb, shm_estimate,
                                  "slurm.preflight_shm_gb"))  # fmt: skip
    return checks


# ---------------------------------------------------------------- network
def chosen_interfaces(environ: dict[str, str], addresses: dict[str, str]) -> dict[str, str | None]:
    """{variable: the interface it selects on this node, or None when it names none that exists},
    for GLOO_SOCKET_IFNAME (exact names) and NCCL_SOCKET_IFNAME ('=eth0' exact, 'eth' a prefix,
    '^docker' an exclusion, which selects nothing to check). The first entry counts: it is the
    one the library uses when it exists."""
    out: dict[str, str | None] = {}
    for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        value = environ.get(var, "").strip()
        if not value or value.startswith("^"):
            continue
        first = value.split(",")[0].strip()
        if var == "GLOO_SOCKET_IFNAME" or first.startswith("="):
            name = first.lstrip("=")
            out[var] = name if name in addresses else None
        else:
            out[var] = next((n for n in addresses if n.startswith(first)), None)
    return out


def connect(source_ip: str, master_ip: str, port: int, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
    """'' when a TCP connection from `source_ip` ('' for any) to the master succeeds, else the error."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            if source_ip:
                s.bind((source_ip, 0))
            s.connect((master_ip, port))
    except OSError as e:
        return e.strerror or str(e)
    return ""


def check_network(
    dist: distenv.DistEnv, environ: dict[str, str], addresses: dict[str, str], dial: Callable[[str, str, int], str]
) -> Check:
    """Each interface chosen for NCCL/gloo exists here and reaches the master (its store's port)."""
    master = f"{dist.master_addr}:{dist.master_port}"
    try:
        master_ip = distenv.resolve(dist.master_addr)
    except OSError as e:
        return Check("network", False, f"cannot resolve the master {dist.master_addr}: {e}")
    chosen = chosen_interfaces(environ, addresses)
    missing = [f"{var}={environ[var]}" for var, iface in chosen.items() if iface is None]
    if missing:
        return Check("network", False, f"no such interface here: {', '.join(missing)}")
    sources = sorted({iface for iface in chosen.values() if iface}) or [""]
    for iface in sources:
        error = dial(addresses[iface] if iface else "", master_ip, dist.master_port)
        if error:
            via = f"from {iface} ({addresses[iface]})" if iface else "from this node"
            return Check("network", False, f"cannot reach the master {master} {via}: {error}")
    via = ", ".join(f"{i} ({addresses[i]})" for i in sources if i) or "the default route"
    return Check("network", True, f"master {master} reached via {via}")


# ---------------------------------------------------------------- all ranks
def bus_bandwidth(nbytes: int, seconds: float, world: int) -> float:
    """GB/s, nccl-tests' bus bandwidth of an all-reduce: algbw x 2(n-1)/n."""
    return nbytes / seconds / 1e9 * 2 * (world - 1) / world


def all_reduce_busbw(device, world: int) -> float | None:
    """This rank's measured bus bandwidth over ALLREDUCE_ITERS all-reduces (one warm-up first)."""
    if world < 2:
        return None
    x = torch.ones(ALLREDUCE_BYTES // 4, dtype=torch.float32, device=device)

    def sync() -> None:
        if x.is_cuda:
            torch.cuda.synchronize(device)

    dist.all_reduce(x)  # connections and buffers set up outside the timing
    sync()
    t0 = time.perf_counter()
    for _ in range(ALLREDUCE_ITERS):
        dist.all_reduce(x)
    sync()
    return bus_bandwidth(ALLREDUCE_BYTES * ALLREDUCE_ITERS, time.perf_counter() - t0, world)


def verdict(reports: list[NodeReport]) -> PreflightFailed | None:
    """The one line naming every node that failed, and why; None when all passed."""
    bad = [r for r in reports if r.problem]
    if not bad:
        return None
    text = "; ".join(f"{r.host}: {r.problem}" for r in bad)
    return PreflightFailed(f"pre-flight failed on {text}", [r.host for r in bad])


def summary(reports: list[NodeReport], world: int) -> str:
    """Rank 0's log line for a pre-flight that passed."""
    line = f"pre-flight: {len(reports)} node(s) passed ({', '.join(c.name for c in reports[0].checks)})"
    measured = [r for r in reports if r.busbw_gbps is not None]
    if measured:
        slowest = min(measured, key=lambda r: r.busbw_gbps or 0.0)
        each = ", ".join(f"{r.host} {r.busbw_gbps:.2f}" for r in measured)
        line += (f"; all-reduce of {ALLREDUCE_BYTES >> 20} MiB over {world} ranks, bus bandwidth GB/s: {each}; "
                 f"slowest {slowest.host}")  # fmt: skip
    return line


def run(spec: JobSpec, folder: RunFolder, env: distenv.DistEnv, device, log: Callable[[str], None]) -> None:
    """Every rank: the node checks (its node's first rank), the verdict, the all-reduce, the
    record. Raises PreflightFailed on every rank when a node failed."""
    host = socket.gethostname()
    report = None
    if env.local_rank == 0:
        report = NodeReport(host)
        report.checks.append(check_gpus(spec.slurm.gpus_per_node, TorchGpus()))
        share = env.local_world_size / env.world_size
        report.checks += space_checks(spec, folder.checkpoints_dir(spec), host, share)
        report.checks.append(check_network(env, dict(os.environ), distenv.interface_addresses(), connect))
    gathered: list[NodeReport | None] = [None] * env.world_size
    dist.all_gather_object(gathered, report)
    reports = [r for r in gathered if r is not None]
    failed = verdict(reports)
    if failed is None:
        measured: list[tuple[str, float | None] | None] = [None] * env.world_size
        dist.all_gather_object(measured, (host, all_reduce_busbw(device, env.world_size)))
        for r in reports:
            speeds = [bw for item in measured if item and item[0] == r.host and (bw := item[1]) is not None]
            r.busbw_gbps = min(speeds) if speeds else None
    if report is not None:
        mine = next(r for r in reports if r.host == host)
        _record(folder.node_record(env.job_id, env.restart, host), mine, reports, failed)
    if env.rank == 0:
        log(str(failed) if failed else summary(reports, env.world_size))
    if failed is not None:
        raise failed


def _record(path: Path, mine: NodeReport, reports: list[NodeReport], failed: PreflightFailed | None) -> None:
    """Add the pre-flight to the node record written before it (worker/rank.py's `_record_node`)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    measured = [r for r in reports if r.busbw_gbps is not None]
    slowest = min(measured, key=lambda r: r.busbw_gbps or 0.0).host if measured else ""
    record["preflight"] = {**mine.to_dict(), "passed": failed is None, "slowest_node": slowest,
                           "failed_nodes": failed.nodes if failed else []}  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
