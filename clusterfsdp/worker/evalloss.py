"""What a summed loss is divided by, and the loss over the held-out samples: the trained
labels of a step over all ranks (so every trained token weighs the same whatever the world
size, micro-batch or padding), and the mean eval loss, each rank its slice of the fixed eval
order, sums all-reduced. Beside train.py, which calls both."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..core.spec import JobSpec
from ..data.mixsamples import MixtureSamples
from ..data.samples import Batch, PreparedSamples
from . import preference


def label_total(spec: JobSpec, samples, batches: list[Batch], group) -> float:
    """Trained labels in this step over all ranks: what the summed loss is divided by, so every
    trained token weighs the same whatever the world size, micro-batch or padding."""
    if samples.all_labels_trained:
        return float(sum(b.labels.numel() for b in batches) * spec.world_size)
    total = torch.tensor([float(sum(b.label_count for b in batches))])
    if group is not None:
        dist.all_reduce(total, group=group)
    return max(1.0, float(total))


def evaluate(
    model, loss_fn, samples: PreparedSamples | MixtureSamples, batches: int, spec: JobSpec, device: torch.device,
    rank: int, world: int,
) -> float:  # fmt: skip
    """Mean loss over the first `batches` global micro-batches of the fixed evaluation order:
    every rank its slice, the sums of loss and of trained labels all-reduced."""
    mb = spec.train.micro_batch_size
    totals = torch.zeros(2, dtype=torch.float64, device=device)
    model.eval()
    if isinstance(loss_fn, preference.PreferenceLoss):  # its sums reset (kto: its KL estimate over all the batches)
        loss_fn.begin(model, [samples.batch(j * world * mb, rank, world, mb) for j in range(batches)], device)
    with torch.no_grad():
        for j in range(batches):
            batch = samples.batch(j * world * mb, rank, world, mb)
            totals[0] += loss_fn(model, batch.to(device)).double()
            totals[1] += batch.label_count
    model.train()
    if dist.is_initialized():
        dist.all_reduce(totals)
    return float(totals[0] / totals[1].clamp(min=1))
