"""Elastic starts (`slurm.nodes = "MIN-MAX"`): growing onto nodes that came free.

The job was queued with `--nodes=MIN-MAX` and Slurm started it on what was free. While an
incarnation runs below MAX, rank 0 asks the controller every `slurm.grow_check_s` which nodes of
the job's partition are idle (one `sinfo` call, in a thread: the training loop never waits on
it), leaving out the nodes the job excludes. When two checks in a row find enough to reach a
larger size, the ranks save at the next agreement (stop flag `grow`) and rank 0 requeues the job
(`scontrol requeue`, as after a time-limit save; a follow-up job where Slurm refuses): the same
batch script, dispatched by submitit again, starts on as many nodes as are free then, and the
workers resume from the checkpoint on that size with the grad_accum that keeps the global batch
(`JobSpec.on_nodes`). At most `slurm.max_grows` grows per run (the `requeued` events of cause
`grow`); a grow saves at the step it stops at, so it redoes no step.

Torch-free: the worker's rank 0 runs it, `status` reads the sizes of the incarnations.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..core import slurmcli
from ..core.records import Cause, Event, EventKind

if TYPE_CHECKING:  # (`status` imports this module and never loads the spec)
    from ..core import spec as specmod


def grows_used(events: Iterable[Event]) -> int:
    """Grows of the run so far: rank 0 writes one `requeued` event of cause grow for each."""
    return sum(1 for e in events if e.event is EventKind.REQUEUED and e.cause is Cause.GROW)


def target_size(nodes: specmod.NodeRange, now: int, free: int) -> int | None:
    """The node count to grow to from `now` with `free` more nodes free (None: no larger size)."""
    size = min(nodes.high, now + free)
    return size if size > now else None


def idle_nodes(partition: str) -> set[str]:
    """The partition's nodes that are idle and usable now (sinfo; the default partition for '')."""
    return {
        node
        for node, state in slurmcli.partition_nodes(partition).items()
        if slurmcli.usable(state) and state.rstrip("~#!%$@^-") == "idle"
    }


def job_placement(job_id: str) -> tuple[str, set[str]]:
    """(the job's partition, the nodes it excludes) as Slurm holds them (`scontrol show job`:
    the quarantined and failed nodes clusterfsdp added to --exclude, and the user's own)."""
    out = slurmcli.run(["scontrol", "-o", "show", "job", job_id], retry_s=0)
    fields = dict(word.split("=", 1) for word in out.split() if "=" in word)
    excluded = fields.get("ExcNodeList", "")
    names = set(slurmcli.hostnames(excluded)) if excluded and excluded != "(null)" else set()
    return fields.get("Partition", ""), names


class GrowWatch:
    """Rank 0's check for free nodes while an incarnation runs below its largest size: `reason`
    is what it found ('' until then), set by a daemon thread; `close` ends the thread."""

    def __init__(
        self,
        nodes: specmod.NodeRange,
        now: int,
        every_s: float,
        grows: tuple[int, int],
        placement: tuple[str, set[str]],
        idle: Callable[[str], set[str]] = idle_nodes,
    ):
        self.nodes, self.now, self.every_s, self.grows = nodes, now, every_s, grows
        self.partition, self.excluded = placement
        self.idle = idle
        self.reason = ""
        self._seen: int | None = None  # the size the previous check found room for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="clusterfsdp-grow-watch", daemon=True)

    def start(self) -> GrowWatch:
        self._thread.start()
        return self

    def check(self) -> str:
        """One check: the grow's reason once two checks in a row found room for a larger size."""
        try:
            free = sorted(self.idle(self.partition) - self.excluded)
        except slurmcli.SlurmError:
            free = []  # (the controller did not answer: no grow on a guess)
        size = target_size(self.nodes, self.now, len(free))
        confirmed = size is not None and self._seen is not None and size >= self._seen
        self._seen = size
        if confirmed and size is not None:
            used, most = self.grows
            self.reason = (
                f"{','.join(free)} free (sinfo, twice {self.every_s:g} s apart): growing from {self.now} to {size} "
                f"node(s) of slurm.nodes = '{self.nodes.render()}' (grow {used + 1} of slurm.max_grows = {most})"
            )
        return self.reason

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            if self.check():
                return

    def close(self) -> None:
        self._stop.set()


def watch(spec: specmod.JobSpec, job_id: str, nodes_now: int, events: list[Event]) -> GrowWatch | None:
    """Rank 0's GrowWatch for this incarnation, started; None when it cannot grow (a count, the
    largest size already, slurm.max_grows used up, or Slurm cannot say where the job runs)."""
    nodes, s = spec.node_range, spec.slurm
    used = grows_used(events)
    if not nodes.elastic or nodes_now >= nodes.high or used >= s.max_grows:
        return None
    try:
        placement = job_placement(job_id)
    except slurmcli.SlurmError:
        return None
    return GrowWatch(nodes, nodes_now, s.grow_check_s, (used, s.max_grows), placement).start()
