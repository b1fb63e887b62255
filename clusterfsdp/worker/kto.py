"""KTO (train.objective = 'kto', Ethayarajh et al. 2024) on batches of unpaired examples.

A batch of unpaired examples (data/unpaired.py; data.samples.Batch with `desirable`) holds the
completion rows of its examples, then their KL rows (the prompt with another example's
completion). The loss follows TRL 1.16's `KTOTrainer._compute_loss` (loss_type 'kto'; checked
against it in tests/test_kto.py), per example with the log-ratio r = π - ref of its completion:

    desirable:   λ_D (1 - σ(β (r - z)))      undesirable:   λ_U (1 - σ(β (z - r)))

z the KL estimate: the mean over the KL rows of (π - ref), detached, clamped at 0. TRL takes
that mean over a device's batch and averages it over the devices; here it is the mean over
every KL row of the optimizer step (all micro-batches of all ranks), computed by `begin` in a
no-grad pass before the step's first loss, so that the estimate, like the loss (summed here,
divided by the step's examples over all ranks by the Trainer), is the same at any world size and
grad_accum (with grad_accum 1 and equal batches it is TRL's number). An evaluation estimates it
likewise over all its batches before its first loss (TRL: per eval batch).

The reference log-probs are those of the preference objectives (PreferenceLoss.reference_logps): the
table computed once before step 1 holds two per example (its completion row and its KL row,
where a pair holds its chosen and rejected rows), or with LoRA the model with its adapters off.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from ..core.spec import JobSpec
from ..data.samples import Batch
from .preference import PreferenceLoss, sequence_logps


def kto_losses(
    spec: JobSpec, policy: torch.Tensor, reference: torch.Tensor, kl: torch.Tensor, desirable: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(losses, rewards) per example from the summed log-probs of its completion (policy and
    reference), the step's KL estimate and the labels."""
    p = spec.train.preference
    ratio = policy - reference
    losses = torch.where(
        desirable,
        p.desirable_weight * (1 - torch.sigmoid(p.beta * (ratio - kl))),
        p.undesirable_weight * (1 - torch.sigmoid(p.beta * (kl - ratio))),
    )
    return losses, p.beta * ratio.detach()


def rows(batch: Batch, which: int) -> Batch:
    """The completion rows (0) or the KL rows (1) of an unpaired batch."""
    assert batch.pair_ids is not None
    n = len(batch.pair_ids)
    return Batch(batch.input_ids[which * n : (which + 1) * n], batch.labels[which * n : (which + 1) * n])


class KTOLoss(PreferenceLoss):
    """loss(model, batch) for a batch of unpaired examples: the summed KTO loss, and the sums the
    metrics rows report since `reset`: the rewards of the desirable and the undesirable examples
    (TRL's rewards/chosen, rewards/rejected, their difference rewards/margins) and the KL estimate."""

    def __init__(self, spec: JobSpec, reference: Any, lora: bool, live: Any = None):
        super().__init__(spec, reference, lora, live)
        # desirable, undesirable, their reward sums, KL estimates summed, how many
        self.sums = torch.zeros(6, dtype=torch.float64)
        self.kl: torch.Tensor | None = None
        self.pending: deque[torch.Tensor] = deque()  # the completions' reference log-probs `begin` read

    def reset(self) -> None:
        self.sums.zero_()
        self.kl = None
        self.pending.clear()

    def begin(self, model: Any, batches: list[Batch], device: torch.device) -> None:
        """The KL estimate over these micro-batches (a step's, or an evaluation's), which their
        losses use, in this order (collective: every rank calls it); the sums reset first. The
        reference log-probs of both rows of each batch are read here (PreferenceLoss.reference_logps:
        the table, or with LoRA one adapters-off forward), those of the completions kept for its loss."""
        self.reset()
        self._estimate(model, batches, device)

    def _estimate(self, model: Any, batches: list[Batch], device: torch.device) -> None:
        """self.kl: mean(π - ref) over the KL rows of these batches on every rank, at least 0."""
        total = torch.zeros(2, dtype=torch.float64, device=device)
        with torch.no_grad():
            for batch in (b.to(device) for b in batches):
                reference = self.reference_logps(model, batch)
                assert reference is not None
                self.pending.append(reference[0])
                gap = sequence_logps(model, rows(batch, 1))[0].double() - reference[1].double()
                total += torch.stack([gap.sum(), torch.tensor(float(len(gap)), dtype=torch.float64, device=device)])
        if dist.is_initialized():
            dist.all_reduce(total)
        self.kl = (total[0] / total[1].clamp(min=1)).clamp(min=0).float()  # TRL: detached, at least 0
        self.sums[4:] += torch.stack([self.kl.double().cpu(), torch.ones((), dtype=torch.float64)])

    def __call__(self, model: Any, batch: Batch) -> torch.Tensor:
        if not self.pending:  # a batch `begin` did not see: its own estimate
            self._estimate(model, [batch], batch.input_ids.device)
        assert self.kl is not None and batch.desirable is not None
        reference = self.pending.popleft()
        logps, _ = sequence_logps(model, rows(batch, 0))
        desirable = batch.desirable.to(logps.device)
        losses, rewards = kto_losses(self.spec, logps, reference, self.kl, desirable)
        rewards = rewards.double()
        self.sums[:4] += (
            torch.stack([desirable.sum(), (~desirable).sum(), rewards[desirable].sum(), rewards[~desirable].sum()])
            .double()
            .cpu()
        )
        return losses.sum()

    def row(self, group: Any, prefix: str = "") -> dict[str, float]:
        """The means over every rank's examples since `reset`: reward_chosen (of the desirable
        examples), reward_rejected (undesirable), reward_margin (their difference; each only when
        there were such examples, as TRL) and kl (collective over the gloo `group`)."""
        sums = self.sums.clone()
        if group is not None:
            dist.all_reduce(sums, group=group)
        out = {}
        if sums[0] > 0:
            out[f"{prefix}reward_chosen"] = float(sums[2] / sums[0])
        if sums[1] > 0:
            out[f"{prefix}reward_rejected"] = float(sums[3] / sums[1])
        if sums[0] > 0 and sums[1] > 0:
            out[f"{prefix}reward_margin"] = out[f"{prefix}reward_chosen"] - out[f"{prefix}reward_rejected"]
        out[f"{prefix}kl"] = float(sums[4] / sums[5].clamp(min=1))
        return out
