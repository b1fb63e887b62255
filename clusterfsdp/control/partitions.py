"""What a Slurm cluster has free now: its partitions, with nodes, GPUs and CPUs by state, from
one `sinfo` call (never one `scontrol show node` per node).

`sinfo -O` (long format) is used because only it has `GresUsed` (in `-o`, `%b` is the active
features, not the GRES in use). Without `--Node`, sinfo prints one line per group of nodes of
a partition that share every printed field, so a group has one state, one GRES and one GRES in
use, and its CPU counts are the group's sums. A field size of 0 prints the whole value (no
20-character cut) and the `|` after it is a suffix, so the output splits on `|` whatever the
values hold. Checked against Slurm 22.05's sinfo (src/sinfo/opts.c `_parse_long_token`,
print.c `_print_str`, common/gres.c `_node_gres_used`) and `man sinfo`.
"""

from __future__ import annotations

import re
from typing import Literal

from ..core import slurmcli
from ..core.errors import UserError
from ..core.value import value

FIELDS = ("Partition", "Available", "Time", "Nodes", "StateLong", "CPUsState", "Gres", "GresUsed")
SINFO_FORMAT = ",".join(f"{f}:0|" for f in FIELDS[:-1]) + f",{FIELDS[-1]}:0"
SINFO_COMMAND = ["sinfo", "-h", "-O", SINFO_FORMAT]

NodeUse = Literal["idle", "mixed", "allocated", "unavailable"]
_BUSY = {"allocated", "completing", "planned", "reserved"}
# Words that keep new jobs off a node, in the base state or in a "+flag" (newer Slurm prints
# states such as "idle+drain"): any of them makes the node unavailable.
_OFF = ("drain", "down", "fail", "maint", "reboot", "inval", "unknown", "future", "not_responding")
# A GRES entry's trailing "(S:0-1)" (sockets) or "(IDX:0-3)" (indices in use).
_TOPOLOGY = r"\([^()]*\)$"
_COUNT = r"^(\d+)([KMGT]?)$"
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


class SinfoError(UserError, ValueError):
    """sinfo printed a line this parser does not understand (a newer or patched Slurm)."""


@value(frozen=True)
class Gres:
    """The GPUs of one node, from a GRES string such as `gpu:h100:8(S:0-1),nic:1`."""

    gpus: int
    types: tuple[str, ...]


def parse_gres(text: str, name: str = "gpu") -> Gres:
    """Count `name` resources in a Gres or GresUsed value; `(null)` and `N/A` mean none.

    Entries are split at commas outside parentheses, since a socket or index list may hold
    commas (`gpu:2(S:0,2)`); a bare name counts one, as slurm.conf reads `Gres=gpu`."""
    count, types = 0, []
    for entry in _split_top_level(text.strip()):
        if entry in ("", "(null)", "N/A"):
            continue
        parts = re.sub(_TOPOLOGY, "", entry).split(":")
        if parts[0] != name:
            continue
        number = re.match(_COUNT, parts[-1]) if len(parts) > 1 else None
        if len(parts) > 3 or (len(parts) == 3 and number is None):
            raise SinfoError(f"cannot read the GRES entry {entry!r} in {text!r}")
        kind = parts[1] if len(parts) == 3 or (len(parts) == 2 and number is None) else None
        if kind and kind != "(null)":
            types.append(kind)
        count += int(number[1]) * _UNITS[number[2]] if number else 1
    return Gres(count, tuple(dict.fromkeys(types)))


def _split_top_level(text: str) -> list[str]:
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def node_use(state: str) -> NodeUse:
    """What a node state means for a new job. `idle~` (powered down) can be started on demand;
    a `*` (not responding) or a drain/down/fail/maint/reboot state takes no new job."""
    word = state.strip().lower()
    if "*" in word or any(off in word for off in _OFF):
        return "unavailable"
    base = re.split(r"[+$^@#%~!\-]", word, maxsplit=1)[0]
    if base == "idle":
        return "idle"
    if base == "mixed":
        return "mixed"
    if base in _BUSY:
        return "allocated"
    return "unavailable"


@value(frozen=True)
class NodeGroup:
    """One sinfo line: nodes of one partition with the same state, GRES and GRES in use."""

    partition: str
    default: bool
    available: str  # the partition's state: up, down, drain, inact
    time_limit: str
    nodes: int
    state: str
    cpus_allocated: int
    cpus_idle: int
    cpus_total: int
    gpus_per_node: Gres
    gpus_used_per_node: int

    @property
    def use(self) -> NodeUse:
        return node_use(self.state)


def parse_line(line: str) -> NodeGroup:
    fields = line.split("|")
    if len(fields) != len(FIELDS):
        raise SinfoError(f"expected {len(FIELDS)} fields separated by '|', got {len(fields)}: {line!r}")
    partition, available, time_limit, nodes, state, cpus, gres, gres_used = (f.strip() for f in fields)
    try:
        allocated, idle, _other, total = (int(x) for x in cpus.split("/"))
        count = int(nodes)
    except ValueError:
        raise SinfoError(f"cannot read the node or CPU counts in {line!r}") from None
    return NodeGroup(
        partition.rstrip("*"),
        partition.endswith("*"),
        available,
        time_limit,
        count,
        state,
        allocated,
        idle,
        total,
        parse_gres(gres),
        parse_gres(gres_used).gpus,
    )


@value(frozen=True)
class Partition:
    """A partition's nodes, GPUs and CPUs by what a new job can have of them now."""

    name: str
    default: bool
    available: str
    time_limit: str
    nodes_idle: int
    nodes_mixed: int
    nodes_allocated: int
    nodes_unavailable: int
    gpus_total: int
    gpus_free: int  # unallocated GPUs on idle and mixed nodes: what a job could get now
    gpus_max_per_node: int
    gpu_types: tuple[str, ...]
    cpus_total: int
    cpus_free: int  # idle CPUs on idle and mixed nodes

    @property
    def nodes_total(self) -> int:
        return self.nodes_idle + self.nodes_mixed + self.nodes_allocated + self.nodes_unavailable

    @property
    def up(self) -> bool:
        return self.available == "up"


def partitions(groups: list[NodeGroup]) -> list[Partition]:
    """Groups summed per partition, in sinfo's order (the default partition is marked, not moved)."""
    by_name: dict[str, list[NodeGroup]] = {}
    for g in groups:
        by_name.setdefault(g.partition, []).append(g)
    out = []
    for name, gs in by_name.items():
        nodes = {use: sum(g.nodes for g in gs if g.use == use) for use in ("idle", "mixed", "allocated", "unavailable")}
        usable = [g for g in gs if g.use in ("idle", "mixed")]
        out.append(
            Partition(
                name,
                any(g.default for g in gs),
                gs[0].available,
                gs[0].time_limit,
                nodes["idle"],
                nodes["mixed"],
                nodes["allocated"],
                nodes["unavailable"],
                sum(g.nodes * g.gpus_per_node.gpus for g in gs),
                sum(g.nodes * max(0, g.gpus_per_node.gpus - g.gpus_used_per_node) for g in usable),
                max((g.gpus_per_node.gpus for g in gs), default=0),
                tuple(dict.fromkeys(t for g in gs for t in g.gpus_per_node.types)),
                sum(g.cpus_total for g in gs),
                sum(g.cpus_idle for g in usable),
            )
        )
    return out


def parse(text: str) -> list[Partition]:
    return partitions([parse_line(line) for line in text.splitlines() if line.strip()])


def query_partitions() -> list[Partition]:
    """Every partition this user can see, from one sinfo call (SlurmError if sinfo fails)."""
    text = slurmcli.run(SINFO_COMMAND)
    try:
        return parse(text)
    except SinfoError as e:
        raise slurmcli.SlurmError(f"sinfo: {e}") from None
