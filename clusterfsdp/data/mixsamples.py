"""Training samples of a mixture (`[[data.sources]]`) on a rank: each position of the global
order reads the sample mixture.Schedule names from that source's own prepared samples. Like
PreparedSamples, the position is the only state (positions the numerical guard took out are
passed over, as there), so a resume on any world size is exact."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..core.spec import JobSpec
from .cache import text_hash
from .mixture import Part, Schedule, epoch_samples
from .samples import Batch, PreparedSamples, Skipped, pair_id, stack
from .samplesets import index_id


class MixtureSamples:
    """The samples of several prepared datasets interleaved by weight (mixture.py)."""

    def __init__(self, parts: list[PreparedSamples], weights: list[float], seed: int):
        self.parts, self.schedule = parts, Schedule(weights, seed)
        self.count = epoch_samples([Part("", w, p.count, 0.0) for p, w in zip(parts, weights, strict=True)])
        self.manifest: dict[str, Any] = {
            "max_id": max(int(p.manifest["max_id"]) for p in parts),
            "vocab_size": max(int(p.manifest["vocab_size"]) for p in parts),
        }
        self.skipped = Skipped()  # set by the numerical guard (training order only)

    @property
    def all_labels_trained(self) -> bool:
        return all(p.all_labels_trained for p in self.parts)

    def source_of(self, position: int) -> int:
        """The source (its entry of data.sources) the sample at a position of the order comes from."""
        return self.schedule(position)[0]

    def batch(self, consumed: int, dp_rank: int, dp_size: int, micro_batch: int) -> Batch:
        """This rank's micro-batch of the global batch that starts at sample `consumed`."""
        first = consumed + dp_rank * micro_batch
        samples = []
        for position in range(first, first + micro_batch):
            source, k = self.schedule(self.skipped.raw(position))
            part = self.parts[source]
            sample = part.sample(part.index_of(k))
            if sample.pair_id >= 0:
                sample.pair_id = pair_id(source, sample.pair_id)
            samples.append(sample)
        return stack(samples)


def open_mixture(spec: JobSpec, folders: list[Path], role: str = "train") -> tuple[MixtureSamples, str]:
    """The mixture of the prepared datasets of data.sources (in its order), training samples or
    the eval samples held out of each (eval.fraction: a fixed order, in the same proportions),
    and its key for the checkpoints: the parts' keys and weights (another mixture reads the
    position differently)."""
    index = index_id(spec, role)
    parts = [PreparedSamples(f, index, spec.data.seq_len, spec.job.seed + i, role) for i, f in enumerate(folders)]
    weights = [s.weight for s in spec.data.sources]
    key = text_hash(json.dumps([[f.name for f in folders], weights]))[:24]
    return MixtureSamples(parts, weights, spec.job.seed), key
