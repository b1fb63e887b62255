"""From the launcher's environment to torch.distributed: ranks, master address and port,
network interface, InfiniBand HCAs, device binding, and a per-node record of the choices.

Pure Python (no torch import): the hostlist parser and rank derivation are also used by the
notebook launcher and tested against `scontrol show hostnames`.
"""

from __future__ import annotations

import errno
import fcntl
import ipaddress
import itertools
import json
import os
import random
import re
import socket
import struct
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

from ..core.slurmcli import batch_job_id


# ---------------------------------------------------------------- Slurm hostlists
def expand_hostlist(hostlist: str) -> list[str]:
    """Expand Slurm hostlist syntax: 'gpu[001-004,010],cpu7', 'a[1-2]b[3-4]', 'n[01-02]-ib'."""
    hosts: list[str] = []
    for item in _split_top_level(hostlist.strip()):
        parts = re.split(r"(\[[^\]]*\])", item)
        choices = []
        for part in parts:
            if part.startswith("["):
                choices.append(_expand_range(part[1:-1], hostlist))
            elif part:
                choices.append([part])
        hosts += ["".join(p) for p in itertools.product(*choices)]
    return hosts


def _split_top_level(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"unbalanced ']' in hostlist {text!r}")
        if ch == "," and depth == 0:
            if cur:
                out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError(f"unbalanced '[' in hostlist {text!r}")
    if cur:
        out.append(cur)
    return out


def _expand_range(spec: str, whole: str) -> list[str]:
    out = []
    for part in spec.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            raise ValueError(f"bad range {part!r} in hostlist {whole!r}")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        width = len(lo) if lo.startswith("0") or len(lo) == len(hi) else 0
        if int(hi) < int(lo):
            raise ValueError(f"descending range {part!r} in hostlist {whole!r}")
        out += [str(i).zfill(width) for i in range(int(lo), int(hi) + 1)]
    return out


def tasks_per_node(value: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE form '2(x3),1' -> [2, 2, 2, 1]."""
    out = []
    for part in value.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"bad tasks-per-node value {value!r}")
        out += [int(m.group(1))] * int(m.group(2) or 1)
    return out


# ---------------------------------------------------------------- ranks
@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    master_addr: str
    master_port: int
    job_id: str
    restart: int
    launcher: str  # slurm | submitit-local | torchrun | single

    def export(self) -> dict[str, str]:
        """The variables torch.distributed's env:// rendezvous reads."""
        return {
            "RANK": str(self.rank),
            "LOCAL_RANK": str(self.local_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
            "GROUP_RANK": str(self.node_rank),
        }


EPHEMERAL_PORTS = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL = (32768, 60999)  # the kernel's default, when the file cannot be read
MASTER_PORTS = range(15000, 65536)  # where derived master ports come from (below: services, Slurm's srun ports)


def ephemeral_ports(path: Path = EPHEMERAL_PORTS) -> tuple[int, int]:
    """The kernel's range of ports for outgoing connections (net.ipv4.ip_local_port_range)."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
        return lo, hi
    except (OSError, ValueError):
        return LINUX_EPHEMERAL


def master_port_ranges(ephemeral: tuple[int, int]) -> list[range]:
    """MASTER_PORTS outside the ephemeral range: a port the kernel may hand to any outgoing
    connection at any time is one another process can hold when the master binds it. Where
    too little is left (a range set to cover nearly everything), all of MASTER_PORTS."""
    lo, hi = ephemeral
    outside = [range(MASTER_PORTS.start, min(lo, MASTER_PORTS.stop)), range(max(hi + 1, MASTER_PORTS.start), 65536)]
    outside = [r for r in outside if len(r)]
    return outside if sum(len(r) for r in outside) >= 1000 else [MASTER_PORTS]


def derive_port(job_id: str, restart: int, step: str = "", ephemeral: tuple[int, int] | None = None) -> int:
    """Same on every rank of a job step (computed, not exchanged: every node reads the same
    kernel setting), different per requeue and per step (no TIME_WAIT clashes), outside the
    kernel's ephemeral ports where possible (master_port_ranges)."""
    ranges = master_port_ranges(ephemeral or ephemeral_ports())
    n = zlib.crc32(f"{job_id}.{restart}.{step}".encode()) % sum(len(r) for r in ranges)
    for r in ranges:
        if n < len(r):
            return r[n]
        n -= len(r)
    raise AssertionError("unreachable")


def free_master_port(ephemeral: tuple[int, int] | None = None) -> int:
    """A master port no socket holds now, outside the kernel's ephemeral ports (master_port_ranges),
    for launches on this machine that pick their own port. Not `bind(port 0)`: that port comes from
    the ephemeral range, where the kernel may give it to an outgoing connection between the pick and
    the master's bind (a flaky EADDRINUSE under load)."""
    ranges = master_port_ranges(ephemeral or ephemeral_ports())
    ports = [p for r in ranges for p in r[random.randrange(len(r)) :: 97]]
    random.shuffle(ports)
    port = next((p for p in ports if not port_taken(p)), None)
    if port is None:
        raise MasterPortInUse(f"no free port in {', '.join(f'{r.start}-{r.stop - 1}' for r in ranges)}")
    return port


class MasterPortInUse(RuntimeError):
    """The master's port is held by another process: the rendezvous cannot start (and ranks
    connecting to it would reach that process)."""


def port_taken(port: int) -> bool:
    """Whether binding `port` on every address fails because another socket holds it (bound
    as torch's TCPStore binds it: SO_REUSEADDR, so connections of a previous attempt in
    TIME_WAIT do not count)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
    return False


def master_port_problem(port: int) -> MasterPortInUse:
    """What the master rank says when its port is taken: which port, and what to set instead."""
    lo, hi = ephemeral = ephemeral_ports()
    free = next((p for r in master_port_ranges(ephemeral) for p in r[port % len(r) :: 997] if not port_taken(p)), None)
    instead = f'MASTER_PORT = "{free}"' if free is not None else "MASTER_PORT"
    return MasterPortInUse(
        f"master port {port} on {socket.gethostname()} is in use by another process: set {instead} in the job's "
        f"[env] (a free port outside the kernel's ephemeral ports {lo}-{hi}), or submit again (the port follows "
        "the job id)"
    )


def _oci_node(hosts: list[str], bundle: str) -> int:
    """This task's node index inside a Slurm OCI container (`srun --container`), one task per node.
    Slurm 22.05 writes the container's environment once per step, before the tasks exist: it has
    no task variables of its own, and under sbatch it has the batch step's (SLURM_PROCID=0 on
    every node; measured on the devcluster). The rank is this host's place in the step's node list."""
    name = socket.gethostname().split(".")[0]
    if name not in hosts:
        raise RuntimeError(
            f"OCI container {bundle}: its hostname {name!r} is not one of the step's nodes {hosts}, and Slurm "
            "passes no task rank into OCI containers: remove the 'uts' namespace (and 'hostname') from the "
            "bundle's config.json so the container keeps the node's name"
        )
    return hosts.index(name)


def _step_nodelist(env: dict[str, str]) -> str:
    """The step's hostlist (the job's outside a step), "" if neither is set."""
    return env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", "")


def _step_counts(env: dict[str, str]) -> list[int]:
    """Tasks on each node of the step (the job's outside a step)."""
    return tasks_per_node(env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE") or "1")


def oci_node(env: dict[str, str]) -> int | None:
    """This task's node index (its rank: one task per node) when it runs inside a Slurm OCI
    container (SLURM_CONTAINER) with one task on every node of the step, else None."""
    nodelist = _step_nodelist(env)
    if "SLURM_CONTAINER" not in env or not nodelist or not all(c == 1 for c in _step_counts(env)):
        return None
    return _oci_node(expand_hostlist(nodelist), env["SLURM_CONTAINER"])


def from_environ(env: dict[str, str] | None = None) -> DistEnv:
    """Ranks from Slurm (srun tasks), submitit's local executor, torchrun, or a single process."""
    env = dict(os.environ if env is None else env)
    in_step = "SLURM_STEP_ID" in env and ("SLURM_PROCID" in env or "SLURM_CONTAINER" in env)
    if in_step or env.get("SUBMITIT_EXECUTOR") == "slurm":
        hosts = expand_hostlist(_step_nodelist(env) or env["SLURM_JOB_NODELIST"])
        counts = _step_counts(env)
        in_container = oci_node(env)
        if in_container is not None:
            node, rank, local_rank = in_container, in_container, 0
        else:
            node, rank, local_rank = (
                int(env.get("SLURM_NODEID", "0")),
                int(env["SLURM_PROCID"]),
                int(env.get("SLURM_LOCALID", "0")),
            )
        job_id = batch_job_id(env)
        restart = int(env.get("SLURM_RESTART_COUNT", "0"))
        return DistEnv(
            rank=rank,
            local_rank=local_rank,
            world_size=int(env.get("SLURM_STEP_NUM_TASKS") or env.get("SLURM_NTASKS", "1")),
            local_world_size=counts[min(node, len(counts) - 1)],
            node_rank=node,
            num_nodes=len(hosts),
            master_addr=hosts[0],
            master_port=int(env.get("MASTER_PORT") or derive_port(job_id, restart, env.get("SLURM_STEP_ID", ""))),
            job_id=job_id,
            restart=restart,
            launcher="slurm",
        )
    if env.get("SUBMITIT_EXECUTOR") == "local":
        n = int(env["SUBMITIT_LOCAL_NTASKS"])
        job_id = env["SUBMITIT_LOCAL_JOB_ID"]
        restart = int(env.get("CLUSTERFSDP_RESTART", "0"))
        return DistEnv(
            int(env["SUBMITIT_LOCAL_GLOBALID"]),
            int(env["SUBMITIT_LOCAL_LOCALID"]),
            n,
            n,
            0,
            1,
            "127.0.0.1",
            int(env.get("MASTER_PORT") or derive_port(job_id, restart)),
            job_id,
            restart,
            "submitit-local",
        )
    if "RANK" in env and "WORLD_SIZE" in env:
        return DistEnv(
            int(env["RANK"]),
            int(env.get("LOCAL_RANK", "0")),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])),
            int(env.get("GROUP_RANK", "0")),
            1,
            env.get("MASTER_ADDR", "127.0.0.1"),
            int(env.get("MASTER_PORT", "29500")),
            env.get("CLUSTERFSDP_JOB_ID", "torchrun"),
            0,
            "torchrun",
        )
    port = int(env.get("MASTER_PORT") or derive_port(str(os.getpid()), 0))
    return DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", port, env.get("CLUSTERFSDP_JOB_ID", f"pid{os.getpid()}"), 0, "single")


# ---------------------------------------------------------------- network
def interface_addresses() -> dict[str, str]:
    """{interface: IPv4 address} for every configured interface, via SIOCGIFADDR."""
    out = {}
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                out[name] = socket.inet_ntoa(packed[20:24])
            except OSError:
                continue
    return out


def resolve(host: str) -> str:
    return str(socket.getaddrinfo(host, None, socket.AF_INET)[0][4][0])


def route_interface(master_addr: str) -> tuple[str, str]:
    """(interface, local IP) this node uses to reach the master, found by asking the kernel's routing."""
    master_ip = resolve(master_addr)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect((master_ip, 9))  # UDP connect sends nothing; it only picks a route
        local_ip = s.getsockname()[0]
    for name, ip in interface_addresses().items():
        if ip == local_ip:
            return name, local_ip
    return "", local_ip


def infiniband_hcas(root: str = "/sys/class/infiniband") -> list[str]:
    """HCAs with at least one ACTIVE port (what NCCL_IB_HCA should list)."""
    out = []
    for dev in sorted(Path(root).glob("*")):
        states = [p.read_text() for p in dev.glob("ports/*/state") if p.is_file()]
        if not states or any("ACTIVE" in s for s in states):
            out.append(dev.name)
    return out


FR_BUFFER = "2000"  # collectives the NCCL flight recorder keeps per rank (torchtitan's default)


def network_env(
    dist: DistEnv, user_env: dict[str, str], environ: dict[str, str] | None = None, diagnostics: Path | None = None
) -> tuple[dict[str, str], dict[str, str]]:
    """Variables for NCCL/gloo on this node: (to set, facts for the node record).

    With `diagnostics` (the attempt's diagnostics/<job>.<restart>/ folder) the NCCL flight
    recorder is on, as torchtitan sets it: its ring buffer (TORCH_FR_BUFFER_SIZE, and the older
    name TORCH_NCCL_TRACE_BUFFER_SIZE) and where NCCL dumps it on a collective timeout
    (TORCH_NCCL_DEBUG_INFO_TEMP_FILE, a prefix the rank is appended to). Untested here: no GPU.

    Precedence: what clusterfsdp detects < what the environment already has < the job's [env].
    """
    environ = dict(os.environ if environ is None else environ)
    facts: dict[str, str] = {}
    chosen: dict[str, str] = {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "PYTORCH_ALLOC_CONF": "expandable_segments:True",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
    }
    if diagnostics is not None:
        chosen["TORCH_FR_BUFFER_SIZE"] = chosen["TORCH_NCCL_TRACE_BUFFER_SIZE"] = FR_BUFFER
        chosen["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] = str(diagnostics / "nccl_trace_rank_")
    if dist.num_nodes > 1:
        master_ip = resolve(dist.master_addr)
        if ipaddress.ip_address(master_ip).is_loopback:
            raise RuntimeError(
                f"master {dist.master_addr} resolves to loopback {master_ip} on {socket.gethostname()}: "
                "fix /etc/hosts on the nodes (other nodes could never reach it)"
            )
        iface, ip = route_interface(dist.master_addr)
        facts.update(master_ip=master_ip, interface=iface, local_ip=ip)
        if iface and iface != "lo":
            chosen["NCCL_SOCKET_IFNAME"] = f"={iface}"
            chosen["GLOO_SOCKET_IFNAME"] = iface
    hcas = infiniband_hcas()
    facts["ib_hcas"] = ",".join(hcas)
    if hcas:
        chosen["NCCL_IB_HCA"] = ",".join(f"={h}" for h in hcas)
    result = {k: v for k, v in chosen.items() if k not in environ}
    result.update(user_env)
    # CUDA_DEVICE_MAX_CONNECTIONS=1 serializes FSDP2's reduce-scatter with compute; it is never set here.
    return result, facts


def write_node_record(path: Path, dist: DistEnv, facts: dict[str, str], extra: dict) -> None:
    """What this node chose, for diagnosing a failed multi-node start (no secrets: only known prefixes)."""
    safe = {
        k: v
        for k, v in os.environ.items()
        if re.match(
            r"(NCCL_|GLOO_|TORCH_|CUDA_VISIBLE|SLURM_(JOB_ID|NODEID|PROCID|STEP_NODELIST|JOB_NODELIST|RESTART_COUNT|TASKS_PER_NODE)|MASTER_|OMP_NUM)",
            k,
        )
        and not re.search(r"TOKEN|KEY|SECRET|PASSWORD", k)
    }
    record = {"hostname": socket.gethostname(), "dist": asdict(dist), **facts, "env": safe, **extra}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
