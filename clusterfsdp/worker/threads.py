"""How many CPU threads each rank's torch uses for its own operators (intra-op: OpenMP and MKL).

torch's default is one thread per CPU the process may run on, in every rank. Ranks that share
those CPUs (the local executor's ranks on one machine, ranks under Slurm without CPU binding,
the devcluster's "nodes" on one VM) then run N x CPUs threads on CPUs threads' worth of cores,
and OpenMP's threads spin-wait after each parallel region (libgomp's default) on the cores the
other ranks need: a two-"node" FSDP1 run on the devcluster took about 4x the CPU of the same
FSDP2 run (bench/fsdp_cpu_bench.py, bench/README.md), and 3.4x its wall time on two local
ranks. torchrun sets OMP_NUM_THREADS=1 for the same reason; here each rank gets its share
instead: the CPUs it may run on, divided among the ranks on the same machine (same boot id)
whose CPU sets overlap its own. Slurm-bound tasks (disjoint sets) keep all of theirs.
`OMP_NUM_THREADS` set by the user (environment or `[env]`) is left as it is.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ..core.procs import boot_id

USER_SETTING = "OMP_NUM_THREADS"


def share(mine: frozenset[int], machine: str, everyone: Sequence[tuple[str, Sequence[int]]]) -> tuple[int, int]:
    """(this rank's threads, the ranks sharing its CPUs): its CPUs divided among the ranks of
    `everyone` (each rank's machine and CPU set, this one included) on the same machine whose
    CPUs overlap its own."""
    sharing = sum(1 for where, cpus in everyone if where == machine and not mine.isdisjoint(cpus))
    return max(1, len(mine) // max(1, sharing)), sharing


def apply() -> tuple[int, str]:
    """Collective (every rank, once, after init_process_group): sets this rank's torch threads
    unless the user chose them; returns (threads, why) for the log and the node record."""
    mine, machine = frozenset(os.sched_getaffinity(0)), boot_id() or socket.gethostname()
    everyone: list[tuple[str, list[int]] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (machine, sorted(mine)))  # on every rank, whatever it decides
    if os.environ.get(USER_SETTING):
        return torch.get_num_threads(), f"{USER_SETTING}={os.environ[USER_SETTING]}"
    threads, sharing = share(mine, machine, [p for p in everyone if p is not None])
    torch.set_num_threads(threads)
    return threads, f"{len(mine)} CPU(s) shared by {sharing} rank(s) on this machine; {USER_SETTING} chooses"
