"""Stop requests from signals: SIGUSR2 (time limit or preemption: save, then requeue) and
SIGTERM (cancel: save, then exit).

Torch-free on purpose: the worker installs the handlers before it imports torch, so a signal
that lands during the seconds of start-up (a short time limit, a preemption right after start)
is kept and acted on at the first step boundary, instead of reaching submitit's handler (which
gives up: "timed-out and not checkpointable") or Python's default (which kills the rank).
"""

from __future__ import annotations

import signal

STOP_NONE, STOP_CANCEL, STOP_PREEMPT = 0, 1, 2


class StopFlags:
    """Signal handlers only set a flag; ranks agree on it at the next step boundary."""

    def __init__(self) -> None:
        self.value = STOP_NONE
        signal.signal(signal.SIGUSR2, lambda *_: self._set(STOP_PREEMPT))
        signal.signal(signal.SIGTERM, lambda *_: self._set(STOP_CANCEL))

    def _set(self, value: int) -> None:
        self.value = max(self.value, value)

    def agree(self, group) -> int:
        """Max flag over all ranks, over a gloo group: no CUDA sync in the training loop."""
        import torch
        import torch.distributed as dist

        t = torch.tensor([self.value], dtype=torch.int32)
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return int(t.item())
