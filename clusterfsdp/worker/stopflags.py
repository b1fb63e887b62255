"""Stop requests from signals: SIGUSR2 (ahead of the time limit, or a preemption with
`preempt_send_user_signal`: save, then requeue) and SIGTERM (a cancel or a preemption: save,
then rank 0 asks Slurm which it was, see `control.outcomes.classify_stop`).

Torch-free on purpose: the worker installs the handlers before it imports torch, so a signal
that lands during the seconds of start-up (a short time limit, a preemption right after start)
is kept and acted on at the first step boundary, instead of reaching Python's default (which
kills the rank).

Ranks agree on the flags with one small all-reduce over gloo, not at every step boundary but
every `every` steps, chosen together from the measured step time so that a signal is acted on
within `latency_budget_s(grace)` seconds: min(1 s, grace / 20), where grace is the time the
signal leaves (slurm.signal_grace_s). With the slowest of the last 8 steps as the step time and
a safety factor of 2, a signal waits at most about one budget even when steps get twice as slow
as recently seen; one step when steps are slower than the budget. At hundreds of ranks the
all-reduce costs milliseconds per agreement instead of per step.
"""

from __future__ import annotations

import math
import signal
import time
from collections import deque

# The largest flag of any rank wins an agreement: a grow gives way to every signal and the budget.
STOP_NONE, STOP_GROW, STOP_TERM, STOP_USR2, STOP_BUDGET = 0, 1, 2, 3, 4
BUDGET = "budget"  # not a signal: slurm.max_gpu_hours used up (core/budget.py)
GROW = "grow"  # not a signal: rank 0 found free nodes for a larger size of a node range (worker/elastic.py)
SIGNAL_NAMES = {STOP_GROW: GROW, STOP_TERM: "SIGTERM", STOP_USR2: "SIGUSR2", STOP_BUDGET: BUDGET}
MAX_LATENCY_S = 1.0
MAX_EVERY = 100
SAFETY = 2.0


def latency_budget_s(grace_s: float) -> float:
    """Seconds a signal may wait for the next agreement: a small part of the time it leaves."""
    return min(MAX_LATENCY_S, max(grace_s, 1.0) / 20)


def agreement_interval(step_times_s: list[float], budget_s: float) -> int:
    """Steps between agreements so that SAFETY x the slowest recent step x interval <= budget."""
    if not step_times_s:
        return 1
    slowest = max(step_times_s)
    if slowest <= 0:
        return MAX_EVERY
    return max(1, min(MAX_EVERY, math.floor(budget_s / (SAFETY * slowest))))


class StopFlags:
    """Signal handlers only set a flag; ranks agree on it at step boundaries (`due`, `agree`)."""

    def __init__(self) -> None:
        self.value = STOP_NONE
        self.every = 1  # steps between agreements, decided together at each agreement
        self._next = 0
        self._steps: deque[float] = deque(maxlen=8)
        self._last_tick: float | None = None
        signal.signal(signal.SIGUSR2, lambda *_: self._set(STOP_USR2))
        signal.signal(signal.SIGTERM, lambda *_: self._set(STOP_TERM))

    def _set(self, value: int) -> None:
        self.value = max(self.value, value)

    def budget_used(self) -> None:
        """The GPU-hours budget is used up on this rank's clock: stop at the next agreement."""
        self._set(STOP_BUDGET)

    def grow(self) -> None:
        """Rank 0 found nodes to grow onto: save and requeue at the next agreement, unless a
        signal or the budget asks more."""
        self._set(STOP_GROW)

    def tick(self) -> None:
        """Call after each optimizer step: measures the step time."""
        now = time.perf_counter()
        if self._last_tick is not None:
            self._steps.append(now - self._last_tick)
        self._last_tick = now

    def pause(self) -> None:
        """Call after work that is not a training step (a save): the next tick does not count it."""
        self._last_tick = None

    def latency_s(self) -> float:
        """How long a signal may wait for the next agreement, from the recent step times."""
        return self.every * max(self._steps, default=0.0)

    def due(self, step: int) -> bool:
        """Whether the ranks agree at this step boundary (the same answer on every rank)."""
        return step >= self._next

    def agree(self, group, step: int, grace_s: float) -> int:
        """Max flag over all ranks, and the next interval (the smallest any rank proposes), in
        one all-reduce over a gloo group: no CUDA sync in the training loop."""
        # torch here, not at the top: `main.run` installs these flags before torch is imported (a
        # signal during that import is not lost), and the notebook kernel imports `main` torch-free.
        import torch
        import torch.distributed as dist

        proposal = agreement_interval(list(self._steps), latency_budget_s(grace_s))
        t = torch.tensor([self.value, -proposal], dtype=torch.int32)
        if dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        self.every = -int(t[1].item())
        self._next = step + self.every
        return int(t[0].item())
