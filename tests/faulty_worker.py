"""One rank of the worker with one fault injected at an optimizer step, for tests/test_doctor.py:

    python tests/faulty_worker.py RUN_DIR      with CLUSTERFSDP_TEST_FAULT=KIND@STEP:RANK

KIND: `oom` raises torch.OutOfMemoryError with CUDA's own message (simulated: there is no GPU
here), `error` a ZeroDivisionError in a function of this file (a bug in user code), `kill` sends
the rank SIGKILL, `hang` stops the rank in a sleep after asking faulthandler to dump its stacks
into diagnostics/<job>.<restart>/rank<R>.txt (the watchdog's stand-in) while the other ranks
wait for it in a collective (the process group's timeout is cut to HANG_TIMEOUT_S so that the
wait ends in a test's time). Everything else is the real worker (`clusterfsdp.worker.main.run`).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

HANG_TIMEOUT_S = 20


def divide_the_loss_by_the_padding(padding: int) -> float:
    return 1.0 / padding


def wait_for_a_lock_that_never_comes() -> None:
    time.sleep(3600)


def _fault(kind: str, run_dir: Path, rank: int) -> None:
    import torch

    if kind == "oom":
        raise torch.OutOfMemoryError(
            "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB of which "
            "1.06 GiB is free. Of the allocated memory 75.31 GiB is allocated by PyTorch"
        )
    if kind == "error":
        divide_the_loss_by_the_padding(0)
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "hang":
        key = max((run_dir / "logs").iterdir(), key=lambda p: p.stat().st_mtime).name
        dump = run_dir / "diagnostics" / key / f"rank{rank}.txt"
        dump.parent.mkdir(parents=True, exist_ok=True)
        faulthandler.dump_traceback_later(3, file=open(dump, "w"))  # noqa: SIM115 - written by faulthandler later
        wait_for_a_lock_that_never_comes()


def main(run_dir: str) -> None:
    kind, _, where = os.environ["CLUSTERFSDP_TEST_FAULT"].partition("@")
    at_step, rank = (int(n) for n in where.split(":"))
    import torch
    import torch.distributed as dist

    if kind == "hang":
        init = dist.init_process_group
        dist.init_process_group = lambda *a, **k: init(*a, **{**k, "timeout": timedelta(seconds=HANG_TIMEOUT_S)})
    if int(os.environ["RANK"]) == rank:
        step = torch.optim.AdamW.step
        calls = 0

        def faulty_step(self, *args, **kwargs):
            nonlocal calls
            calls += 1
            if calls == at_step:
                _fault(kind, Path(run_dir), rank)
            return step(self, *args, **kwargs)

        torch.optim.AdamW.step = faulty_step  # ty: ignore
    from clusterfsdp.worker.main import run

    run(run_dir)


if __name__ == "__main__":
    main(sys.argv[1])
