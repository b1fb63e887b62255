"""A job's data opened on a rank: rank 0 finds (or prepares, data.prepare) the job's datasets
and indexes while the other ranks wait for it on a gloo group with a long timeout (none of them
ever tokenizes on its own); every rank then opens the training and eval samples, those of a
mixture (`[[data.sources]]`) through mixsamples. Apart from samples.py, which reads one prepared
dataset, so that neither samples nor mixsamples imports the other."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch.distributed as dist

from ..core.spec import JobSpec
from . import prepare
from .mixsamples import MixtureSamples, open_mixture
from .samples import PreparedSamples, SyntheticSamples
from .samplesets import eval_batches_note, index_id, sample_roles
from .sources import DataError

PREPARE_WAIT = timedelta(days=7)  # how long ranks > 0 wait for rank 0's prepare


@dataclass
class TrainingData:
    """What a rank reads: training samples, evaluation samples (or None), and the token ids the
    data can hold (the model's vocabulary must cover them; None for synthetic data)."""

    train: PreparedSamples | MixtureSamples | SyntheticSamples | None
    eval: PreparedSamples | MixtureSamples | None
    vocab_size: int | None
    max_id: int = -1
    key: str = ""  # the prepared training dataset's key (recorded in checkpoints)


def open_for_training(spec: JobSpec, rank: int, log) -> TrainingData:
    """Rank 0 finds (or prepares) the job's datasets and indexes; every rank then opens them.
    A DataError on rank 0 reaches every rank, so they all stop with the same message."""
    if spec.data.source != "files":
        return TrainingData(None, None, None)
    group = (
        cast(dist.ProcessGroup, dist.new_group(backend="gloo", timeout=PREPARE_WAIT)) if dist.is_initialized() else None
    )
    answer: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            refs = prepare.ensure(spec, log)
            answer = [[(r.role, str(r.folder)) for r in refs]]
        except Exception as e:  # every rank must hear of it, or they would wait for days
            failure = e
            answer = [str(e) if isinstance(e, DataError) else f"rank 0 could not prepare the data: {e!r}"]
    if group is not None:
        dist.broadcast_object_list(answer, src=0, group=group)
        dist.destroy_process_group(group)
    if failure is not None and not isinstance(failure, DataError):
        raise failure
    if isinstance(answer[0], str):
        raise DataError(answer[0])
    folders: dict[str, str] = dict(answer[0])  # a mixture's train folders: its parts, below
    opened: dict[str, PreparedSamples] = {}
    for role, data_role in sample_roles(spec):
        index = index_id(spec, role)
        opened[role] = PreparedSamples(Path(folders[data_role]), index, spec.data.seq_len, spec.job.seed, role)
    train: PreparedSamples | MixtureSamples = opened["train"]
    held: PreparedSamples | MixtureSamples | None = opened.get("eval")
    key = Path(folders["train"]).name
    if spec.data.sources:
        parts = [Path(f) for role, f in answer[0] if role == "train"]
        train, key = open_mixture(spec, parts)
        if held is not None and not spec.eval.paths:  # eval.fraction: held out of every source
            held = open_mixture(spec, parts, "eval")[0]
    if rank == 0 and held is not None and (note := eval_batches_note(spec, held.count)):
        log(f"data: {note}")
    max_id = max(int(s.manifest["max_id"]) for s in [train, *opened.values()])
    return TrainingData(train, held, int(train.manifest["vocab_size"]), max_id, key)
