"""`clusterfsdp devcluster up|down|status|restart`: a real multi-node Slurm on this machine.

A thin wrapper around ``slurm/devcluster.sh`` (shipped in a wheel as
``clusterfsdp/_slurm/devcluster.sh``). The script makes one controller and N compute
nodes (``node1``, ``node2``, ...), each in its own network and UTS namespace on a private
bridge, with slurmctld, slurmd, slurmdbd and MariaDB, so that ``sbatch``/``srun``/``sacct``
and submitit work as on a real cluster. See docs/devcluster.md.

``--prefix P`` (``CFDC_PREFIX``) makes a second, independent cluster beside the default one
(its own namespaces, bridge, subnet, state folder and lock), e.g. for the test suite's two halves.

This module imports nothing heavy (no torch), so the CLI can call it cheaply.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from ..core.value import value

SUBCOMMANDS: tuple[str, ...] = ("up", "down", "status", "restart")
DEFAULT_STATE = Path("/tmp/clusterfsdp-devcluster")
PREFIX_RE = re.compile(r"[a-z0-9]{1,4}")  # devcluster.sh's rule: it goes into interface names
SCRIPT_NAME = "devcluster.sh"

# Exit codes of devcluster.sh (and of main()).
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2  # also: not root, or a state folder another user controls
EXIT_DOWN = 3  # `status`: the cluster is down or broken
EXIT_MISSING_PACKAGES = 4

PROG = "clusterfsdp devcluster"


def script_candidates() -> list[Path]:
    """Where devcluster.sh may be: package data of an installed wheel, then the repo checkout."""
    package = Path(__file__).parents[1]  # clusterfsdp/ (this file is clusterfsdp/control/devcluster.py)
    return [
        package / "_slurm" / SCRIPT_NAME,
        package.resolve().parent / "slurm" / SCRIPT_NAME,
    ]


def script_path() -> Path:
    """The devcluster.sh to run; raises FileNotFoundError naming the places looked at."""
    candidates = script_candidates()
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(str(p) for p in candidates)
    raise FileNotFoundError(f"{SCRIPT_NAME} not found (looked at {looked})")


def state_dir(environ: dict[str, str] | None = None, prefix: str | None = None) -> Path:
    """The state folder: $CFDC_STATE, else the one devcluster.sh picks for the cluster's prefix
    (`prefix`, else $CFDC_PREFIX): /tmp/clusterfsdp-devcluster, or /tmp/clusterfsdp-devcluster-P."""
    env = os.environ if environ is None else environ
    value = env.get("CFDC_STATE", "")
    if value:
        return Path(value)
    prefix = env.get("CFDC_PREFIX", "") if prefix is None else prefix
    return Path(f"{DEFAULT_STATE}-{prefix}") if prefix else DEFAULT_STATE


@value(frozen=True)
class DevClusterInfo:
    """What a running devcluster told us in ``<state>/env.sh``."""

    state: Path
    prefix: str  # "" for the default cluster (devcluster.sh's CFDC_PREFIX)
    slurm_conf: Path
    nodes: tuple[str, ...]
    node_ips: tuple[str, ...]
    ctl_ip: str
    login_ip: str
    bridge: str
    netns: tuple[str, ...]
    partition: str
    cpus_per_node: int
    mem_per_node_mb: int
    gpus_per_node: int
    first_job_id: int

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """A copy of ``base`` (default os.environ) with SLURM_CONF pointing at this cluster."""
        out = dict(os.environ if base is None else base)
        out["SLURM_CONF"] = str(self.slurm_conf)
        return out

    def script_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        """env() plus what makes devcluster.sh act on this cluster (status, fault, down), not the default one."""
        out = self.env(base)
        out["CFDC_PREFIX"] = self.prefix
        out["CFDC_STATE"] = str(self.state)
        return out


def parse_env_file(text: str) -> dict[str, str]:
    """Parse the ``export KEY=VALUE`` lines of env.sh (values are shell words)."""
    values: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line.startswith("export "):
            continue
        key, sep, raw = line[len("export ") :].partition("=")
        if not sep:
            continue
        words = shlex.split(raw, comments=True)
        values[key.strip()] = words[0] if words else ""
    return values


def read_info(state: Path | None = None) -> DevClusterInfo | None:
    """The running (or last brought-up) cluster's facts, or None when there is no env.sh."""
    folder = state_dir() if state is None else state
    env_file = folder / "env.sh"
    try:
        values = parse_env_file(env_file.read_text())
    except OSError:
        return None
    return DevClusterInfo(
        state=folder,
        prefix=values.get("CFDC_PREFIX", ""),
        slurm_conf=Path(values.get("SLURM_CONF", str(folder / "slurm.conf"))),
        nodes=tuple(values.get("CFDC_NODE_NAMES", "").split()),
        node_ips=tuple(values.get("CFDC_NODE_IPS", "").split()),
        ctl_ip=values.get("CFDC_CTL_IP", ""),
        login_ip=values.get("CFDC_LOGIN_IP", ""),
        bridge=values.get("CFDC_BRIDGE", ""),
        netns=tuple(values.get("CFDC_NETNS", "").split()),
        partition=values.get("CFDC_PARTITION", "debug"),
        cpus_per_node=int(values.get("CFDC_CPUS_PER_NODE", "0") or 0),
        mem_per_node_mb=int(values.get("CFDC_MEM_PER_NODE", "0") or 0),
        gpus_per_node=int(values.get("CFDC_GPUS_PER_NODE", "0") or 0),
        first_job_id=int(values.get("CFDC_FIRST_JOB_ID", "0") or 0),
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description=(
            "A real multi-node Slurm 22.05 cluster on this machine (network namespaces, "
            "slurmctld + slurmd + slurmdbd + MariaDB, fake GPUs). Needs root."
        ),
        epilog=(
            "After `up`, plain sbatch/srun/squeue/sacct work from this shell (or source "
            "<state>/env.sh for SLURM_CONF). Exit codes: 0 ok, 1 failed, 2 not root/usage/unsafe state folder, "
            "3 status: down, 4 missing Debian packages. See docs/devcluster.md."
        ),
    )
    p.add_argument("command", choices=SUBCOMMANDS, help="up | down | status | restart")
    p.add_argument("--nodes", type=int, default=None, help="compute nodes for `up` (default 2)")
    p.add_argument("--state", type=Path, default=None, help=f"state folder (default {DEFAULT_STATE}[-PREFIX])")
    p.add_argument(
        "--prefix",
        default=None,
        help="a second cluster beside the default one: 1-4 of a-z0-9 (its namespaces cfdcP-*, bridge cfbrP, "
        "state /tmp/clusterfsdp-devcluster-P, its own subnet and lock); default: the default cluster",
    )
    return p


def build_command(command: str, script: Path) -> list[str]:
    """The argv that runs the script (through bash: package data may lose its +x bit)."""
    return ["bash", str(script), command]


def main(argv: list[str]) -> int:
    """Run ``devcluster.sh <command>``; returns its exit status."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help or a usage error
        code = exc.code
        return code if isinstance(code, int) else (EXIT_OK if code is None else EXIT_USAGE)
    if os.geteuid() != 0:
        print(
            f"{PROG}: must run as root (network namespaces, a bridge, bind mounts); "
            f"try: sudo clusterfsdp devcluster {args.command}",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        script = script_path()
    except FileNotFoundError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return EXIT_FAILED
    env = dict(os.environ)
    if args.nodes is not None:
        if args.nodes < 1:
            print(f"{PROG}: --nodes must be >= 1", file=sys.stderr)
            return EXIT_USAGE
        env["NODES"] = str(args.nodes)
    if args.state is not None:
        env["CFDC_STATE"] = str(args.state.absolute())
    if args.prefix is not None:
        if args.prefix and not PREFIX_RE.fullmatch(args.prefix):
            print(
                f"{PROG}: --prefix must be 1-4 of a-z0-9 (it goes into interface names), not {args.prefix!r}",
                file=sys.stderr,
            )
            return EXIT_USAGE
        env["CFDC_PREFIX"] = args.prefix
    try:
        rc = subprocess.run(build_command(args.command, script), env=env, check=False).returncode
    except KeyboardInterrupt:
        return 130
    return 128 - rc if rc < 0 else rc  # killed by a signal: 128 + signal number, as a shell says


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
