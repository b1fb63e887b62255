"""One rank of the worker with one fault injected at an optimizer step, for tests/test_doctor.py:

    python tests/faulty_worker.py RUN_DIR      with CLUSTERFSDP_TEST_FAULT=KIND@STEP:RANK[,KIND@STEP:RANK]

KIND: `oom` raises torch.OutOfMemoryError with CUDA's own message (simulated: there is no GPU
here), `error` a ZeroDivisionError in a function of this file (a bug in user code), `bug` breaks
the Trainer's state so that its own code raises a TypeError in the same step (a bug in
clusterfsdp: the innermost frame is worker/train.py, at a line that raises nothing on purpose), `kill` sends
the rank SIGKILL, `hang` stops the rank in a sleep after asking faulthandler to dump its stacks
into diagnostics/<job>.<restart>/rank<R>.txt (the watchdog's stand-in) while the other ranks
wait for it in a collective (the process group's timeout is cut to HANG_TIMEOUT_S so that the
wait ends in a test's time, and kept there: the heartbeat's own timeout rule is switched off),
`stop` SIGSTOPs the rank (frozen: the node watchdog's case), `slow` sleeps (straggler_delay) in every step
from STEP on (a straggler). Everything else is the real worker (`clusterfsdp.worker.main.run`).
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

HANG_TIMEOUT_S = 20
# The straggler rule calls a rank late by more than half the median step, and the other ranks'
# steps include their wait for it (base + delay), so a delay above the base step is always enough.
# A fixed 0.25 s was within that on a loaded 2-core machine (the tiny job's own step is 0.1-0.4 s there)
# and the straggler test failed 1 run in 3: the delay is measured instead, SLOW_FACTOR times this rank's
# median step before the fault, never less than SLOW_MIN_S.
SLOW_MIN_S = 0.8
SLOW_FACTOR = 3.0


def straggler_delay(step_starts: list[float]) -> float:
    """The sleep that makes a rank a straggler whatever the machine's load: SLOW_FACTOR x its median step."""
    gaps = sorted(b - a for a, b in itertools.pairwise(step_starts))
    return max(SLOW_MIN_S, SLOW_FACTOR * gaps[(len(gaps) - 1) // 2]) if gaps else SLOW_MIN_S


def divide_the_loss_by_the_padding(padding: int) -> float:
    return 1.0 / padding


def wait_for_a_lock_that_never_comes() -> None:
    time.sleep(3600)


def _fault(kind: str, run_dir: Path, rank: int, slow_s: float) -> None:
    import torch

    if kind == "oom":
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
            "1.06 GiB is free. Of the allocated memory 75.31 GiB is allocated by PyTorch"
        )
    if kind == "error":
        divide_the_loss_by_the_padding(0)
    if kind == "bug":  # the Trainer's own state broken: its next line of arithmetic fails in clusterfsdp's code
        frame = sys._getframe()  # up to Trainer.step, which called the optimizer's step
        while type(frame.f_locals.get("self")).__name__ != "Trainer":
            frame = frame.f_back
            assert frame is not None, "no Trainer on the stack"
        frame.f_locals["self"].state.tokens_seen = None
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if kind == "slow":
        time.sleep(slow_s)
    if kind == "hang":
        key = max((run_dir / "logs").iterdir(), key=lambda p: p.stat().st_mtime).name
        dump = run_dir / "diagnostics" / key / f"rank{rank}.txt"
        dump.parent.mkdir(parents=True, exist_ok=True)
        faulthandler.dump_traceback_later(3, file=open(dump, "w"))  # noqa: SIM115 - written by faulthandler later
        wait_for_a_lock_that_never_comes()


def main(run_dir: str) -> None:
    faults = [f.partition("@") for f in os.environ["CLUSTERFSDP_TEST_FAULT"].split(",")]
    import torch
    import torch.distributed as dist

    if any(kind == "hang" for kind, _, _ in faults):
        from torch.distributed import distributed_c10d

        init = dist.init_process_group
        dist.init_process_group = lambda *a, **k: init(*a, **{**k, "timeout": timedelta(seconds=HANG_TIMEOUT_S)})
        distributed_c10d._set_pg_timeout = lambda *a, **k: None
    mine = [
        (kind, int(where.split(":")[0]))
        for kind, _, where in faults
        if int(where.split(":")[1]) == int(os.environ["RANK"])
    ]
    if mine:
        step = torch.optim.AdamW.step
        calls = 0
        starts: list[float] = []  # this rank's step starts before any fault: its own step time
        slow_s = SLOW_MIN_S

        def faulty_step(self, *args, **kwargs):
            nonlocal calls, slow_s
            calls += 1
            if not any(calls > at for _, at in mine):
                starts.append(time.monotonic())
                slow_s = straggler_delay(starts)
            for kind, at_step in mine:
                if calls == at_step or (kind == "slow" and calls > at_step):
                    _fault(kind, Path(run_dir), int(os.environ["RANK"]), slow_s)
            return step(self, *args, **kwargs)

        torch.optim.AdamW.step = faulty_step  # ty: ignore
    from clusterfsdp.worker.main import run

    run(run_dir)


if __name__ == "__main__":
    main(sys.argv[1])
