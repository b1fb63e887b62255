"""One rank of the worker with poisoned training samples, for tests/test_numguard.py:

    python tests/poison_worker.py RUN_DIR    with CLUSTERFSDP_TEST_POISON=P,P,...  [CLUSTERFSDP_TEST_SKIP=A-B]

CLUSTERFSDP_TEST_POISON: positions of the training data order (as read, after the numerical
guard's skipped ranges are jumped) whose micro-batch's loss is made NaN: only the rank that reads
such a sample sees it. CLUSTERFSDP_TEST_SKIP: the reference run: it starts with the positions
[A, B) already taken out of the data order, as though a rollback had recorded them before step 1.
Both are read here only, never by clusterfsdp; everything else is the real worker
(`clusterfsdp.worker.main.run`).
"""

from __future__ import annotations

import os
import sys
from collections import deque


def main(run_dir: str) -> None:
    poisoned = {int(p) for p in os.environ["CLUSTERFSDP_TEST_POISON"].split(",")}
    skip = os.environ.get("CLUSTERFSDP_TEST_SKIP", "")
    from clusterfsdp.data.samples import PreparedSamples
    from clusterfsdp.worker import train

    nan_next: deque[bool] = deque()  # one flag per training micro-batch read, in the order step() runs them
    read: list[int] = []
    index_of, batch, loss_fn, restore = (
        PreparedSamples.index_of, PreparedSamples.batch, train._loss_fn, train.Trainer._restore,
    )  # fmt: skip

    def reading_index_of(self, position):
        read.append(position)
        return index_of(self, position)

    def flagging_batch(self, *args, **kwargs):
        read.clear()
        out = batch(self, *args, **kwargs)
        if self.order == "train":
            nan_next.append(bool(poisoned & set(read)))
        return out

    def poisoning_loss_fn(spec):
        inner = loss_fn(spec)

        def loss(model, b):
            value = inner(model, b)
            return value * float("nan") if nan_next and nan_next.popleft() else value

        return loss

    def restore_with_skip(self):
        curve = restore(self)
        if skip and not self.state.skipped:
            self.state.skipped = [[int(n) for n in skip.split("-")]]
        return curve

    PreparedSamples.index_of, PreparedSamples.batch = reading_index_of, flagging_batch  # ty: ignore
    train._loss_fn, train.Trainer._restore = poisoning_loss_fn, restore_with_skip  # ty: ignore
    from clusterfsdp.worker.main import run

    run(run_dir)


if __name__ == "__main__":
    main(sys.argv[1])
