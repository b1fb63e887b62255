"""`slurm.nodes` as a count or a Slurm node range ('2-8': an elastic start), parsed once and
rendered again for the `#SBATCH --nodes` line, so nothing of the job file's text reaches it.

Slurm 22.05 (the version this kit is tested on) takes `--nodes=MIN[-MAX]` only: its size lists
('1,2,4', '1-15:4') came with 23.02, so they are refused here with what to write instead.

With a range the job starts on what is free (as many nodes as Slurm can give at once within the
range); every size in it must keep the global batch, which is defined at the largest size
(`train.grad_accum` is the accumulation there): on n nodes the workers accumulate
largest x grad_accum / n micro-batches, a whole number for every allowed n (`refusal`).
Pure Python: validate and the sbatch renderer use it; the worker resolves its spec with it.
"""

from __future__ import annotations

import math
import re

from ..value import value

_RANGE = r"(\d{1,9})(?:-(\d{1,9}))?"
MAX_NODES = 100_000  # more is a typo (the largest clusters have about 10,000 nodes), and a range is walked size by size


@value(frozen=True)
class NodeRange:
    """Node counts an attempt may start with: `low`..`high`, every one of them (low == high: a
    fixed count)."""

    low: int
    high: int

    @property
    def elastic(self) -> bool:
        return self.low < self.high

    @property
    def sizes(self) -> range:
        return range(self.low, self.high + 1)

    def render(self) -> str:
        """What `#SBATCH --nodes=` gets: 'N' or 'MIN-MAX', made from the parsed numbers."""
        return str(self.low) if not self.elastic else f"{self.low}-{self.high}"


def parse(value: int | str) -> NodeRange:
    """An int or 'N' / 'MIN-MAX' -> NodeRange; ValueError saying what to write instead."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError(f"expected a node count or a range 'MIN-MAX', found {value!r}")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"must be >= 1, found {value}")
        if value > MAX_NODES:
            raise ValueError(f"must be <= {MAX_NODES:,}, found {value}")
        return NodeRange(value, value)
    text = value.strip()
    m = re.fullmatch(_RANGE, text)
    if m is None:
        if re.fullmatch(r"[\d,:\s-]+", text) and ("," in text or ":" in text):
            raise ValueError(
                f"{value!r}: node size lists ('1,2,4', '1-15:4') need Slurm 23.02 or newer, and this kit "
                "writes ranges for Slurm 22.05: give a range 'MIN-MAX' whose every size keeps the global batch"
            )
        raise ValueError(f"expected a node count or a range 'MIN-MAX' (e.g. '2-8'), found {value!r}")
    low = int(m.group(1))
    high = int(m.group(2)) if m.group(2) else low
    if low < 1:
        raise ValueError(f"{value!r}: the least node count is 1")
    if high < low:
        raise ValueError(f"{value!r}: the range goes down; write '{high}-{low}'")
    if high > MAX_NODES:
        raise ValueError(f"{value!r}: at most {MAX_NODES:,} nodes")
    return NodeRange(low, high)


def grad_accum_at(nodes: NodeRange, grad_accum: int, at: int) -> int | None:
    """The accumulation on `at` nodes that keeps the global batch of `grad_accum` on the largest
    size; None when no whole number does."""
    total = nodes.high * grad_accum
    return total // at if at >= 1 and total % at == 0 else None


def refusal(value: int | str, nodes: NodeRange, grad_accum: int, per_node_batch: int) -> str | None:
    """Why a range cannot keep the global batch on every size it allows (None: it can), naming
    the sizes that work, the widest range of them, and the grad_accum that makes every size work.
    `per_node_batch`: samples one node's ranks take per micro-batch (ranks x micro_batch_size)."""
    bad = [n for n in nodes.sizes if grad_accum_at(nodes, grad_accum, n) is None]
    if not bad:
        return None
    good = [n for n in nodes.sizes if n not in bad]
    need = math.lcm(*(n // math.gcd(n, nodes.high) for n in nodes.sizes))
    least = -(-grad_accum // need) * need
    batch = nodes.high * per_node_batch * grad_accum
    widest = _widest_run(good)
    instead = f"a range of those ('{widest}')" if widest else "a count"
    return (
        f"slurm.nodes: {value!r}: on {_sizes(bad)} node(s) no whole train.grad_accum keeps the global batch "
        f"{batch} ({nodes.high} nodes x {per_node_batch} samples per node x grad_accum {grad_accum}, the largest "
        f"size's); sizes that work: {_sizes(good)}; set slurm.nodes to {instead}, or train.grad_accum = {least} "
        f"(every size from {nodes.low} to {nodes.high} then keeps the global batch "
        f"{nodes.high * per_node_batch * least})"
    )


def _sizes(counts: list[int]) -> str:
    return ", ".join(map(str, counts))


def _widest_run(counts: list[int]) -> str:
    """The longest run of consecutive counts, as a range ('' when there is none of two or more);
    of runs as long, the one with the most nodes."""
    runs: list[list[int]] = []
    for n in counts:
        if runs and runs[-1][-1] == n - 1:
            runs[-1].append(n)
        else:
            runs.append([n])
    best = max((r for r in runs if len(r) > 1), key=lambda r: (len(r), r[-1]), default=None)
    return f"{best[0]}-{best[-1]}" if best else ""
