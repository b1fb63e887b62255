"""Preference objectives (train.objective 'dpo', 'ipo', 'simpo', 'orpo') on batches of pairs.

A pair batch (data.samples.Batch with pair_ids) holds the chosen rows of its pairs, then their
rejected rows; one forward of the policy gives every row's summed log-prob of its trained
labels (the answer's tokens). The per-pair losses follow TRL (tests/test_preference.py checks
them against TRL's own code on the same log-probs):

- dpo: -(1 - ls) log σ(β Δ) - ls log σ(-β Δ), Δ = (π_c - ref_c) - (π_r - ref_r) (conservative
  DPO's label smoothing, as TRL's CPO sigmoid and older DPO);
- ipo: (Δ̄ - 1/(2β))², Δ̄ the log-ratios divided by each answer's token count (TRL's DPO ipo);
- simpo: the dpo form on the length-averaged log-probs minus γ/β, no reference (TRL's CPO simpo);
- orpo: -mean log-prob of the chosen answer - β log σ(log odds ratio), no reference. TRL averages
  its NLL term over the chosen tokens of a device's batch; here it is per pair (equal when the
  chosen answers are equally long), so that the loss does not depend on the world size.

The loss a rank returns is the sum over its pairs; the Trainer divides by the pairs of the step
over all ranks (Batch.label_count), so each pair weighs the same whatever the world size.

The reference log-probs (dpo, ipo): with LoRA, the same model with every adapter disabled (no
second model, whatever train.preference.reference says); otherwise, with reference = 'start',
`ReferenceTable`, computed once over every training pair and every evaluated pair by the
reference (the model as it starts, or train.preference.reference_model) and kept in the
checkpoint folder, so a resume (on any world size) reads the same numbers: on Slurm by a job of
its own before the training job starts (worker/reference.py, queued by control/refjob.py),
otherwise by the training job before its first step (`compute_tables`); with reference =
'live', a frozen second copy of the starting model (`build_live`: build.build_model, so sharded
like the policy; not in any checkpoint, built again by every attempt) whose log-probs are
computed each micro-batch, for data a table cannot cover.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

from ..core import ckptfolder
from ..core.spec import JobSpec
from ..core.spec.objective import NEEDS_REFERENCE
from ..data.samples import PART_SHIFT, Batch, PreparedSamples, stack
from ..data.tokens import IGNORE_INDEX
from .build import build_model, token_ids

if TYPE_CHECKING:
    from .model import ParamCount


def sequence_logps(model: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the summed log-prob of its trained labels, and how many there are (fp32).

    A model with the fused lm_head (worker/loss.py `attach`) never holds more than one chunk of
    logits. Otherwise (FSDP1, other architectures) the whole fp32 logits of the batch exist,
    2 x micro_batch x seq_len x vocab values."""
    labels = batch.labels
    valid = labels != IGNORE_INDEX
    fused: Callable[..., torch.Tensor] | None = getattr(model, "clusterfsdp_logps", None)
    if fused is not None:
        return fused(batch.input_ids, labels), valid.sum(dim=1).float()
    logits = model(input_ids=batch.input_ids).logits.float()
    picked = torch.gather(F.log_softmax(logits, dim=-1), 2, torch.where(valid, labels, 0).unsqueeze(2)).squeeze(2)
    return (picked * valid).sum(dim=1), valid.sum(dim=1).float()


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """The LoRA model as its base: every peft layer's adapters off (peft's `disable_adapters`
    flag, which its forward reads; `enable_adapters(False)` would also flip requires_grad of
    the sharded adapter parameters), restored after."""
    layers: list[Any] = [m for m in model.modules() if hasattr(m, "_disable_adapters")]
    before = [m._disable_adapters for m in layers]
    for m in layers:
        m._disable_adapters = True
    try:
        yield
    finally:
        for m, b in zip(layers, before, strict=True):
            m._disable_adapters = b


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x < 0, without cancellation (branch at -ln 2)."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def pair_losses(
    spec: JobSpec,
    policy: tuple[torch.Tensor, torch.Tensor],
    reference: tuple[torch.Tensor, torch.Tensor] | None,
    counts: tuple[torch.Tensor, torch.Tensor],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(losses, chosen rewards, rejected rewards) per pair, from the summed log-probs of the
    chosen and rejected answers (policy and reference) and their token counts."""
    objective, p = spec.train.objective, spec.train.preference
    beta, ls = p.beta, p.label_smoothing
    (pc, pr), (nc, nr) = policy, (counts[0].clamp(min=1), counts[1].clamp(min=1))
    if objective in NEEDS_REFERENCE:
        assert reference is not None
        chosen, rejected = pc - reference[0], pr - reference[1]
        if objective == "dpo":
            delta = chosen - rejected
            losses = -(1 - ls) * F.logsigmoid(beta * delta) - ls * F.logsigmoid(-beta * delta)
        else:  # ipo
            losses = (chosen / nc - rejected / nr - 1 / (2 * beta)) ** 2
        return losses, beta * chosen.detach(), beta * rejected.detach()
    ac, ar = pc / nc, pr / nr
    if objective == "simpo":
        logits = ac - ar - p.simpo_gamma / beta
        losses = -(1 - ls) * F.logsigmoid(beta * logits) - ls * F.logsigmoid(-beta * logits)
    else:  # orpo
        log_odds = (ac - ar) - (_log1mexp(ac) - _log1mexp(ar))
        losses = -ac - beta * F.logsigmoid(log_odds)
    return losses, beta * ac.detach(), beta * ar.detach()


class ReferenceTable:
    """Reference log-probs (chosen, rejected) by pair id, sorted for lookup, and the identity of
    the samples they were computed over (`identity`: pair ids mean nothing in other data)."""

    def __init__(self, ids: np.ndarray, logps: np.ndarray, identity: str = ""):
        order = np.argsort(ids)
        self.ids, self.logps = ids[order], logps[order].astype(np.float32)
        self.identity = identity

    def lookup(self, pair_ids: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        ids = pair_ids.numpy()
        at = np.searchsorted(self.ids, ids)
        if (at >= len(self.ids)).any() or (self.ids[np.minimum(at, len(self.ids) - 1)] != ids).any():
            raise RuntimeError("a pair without a reference log-prob: the reference pass did not cover this data")
        found = torch.from_numpy(self.logps[at]).to(device)
        return found[:, 0], found[:, 1]

    def save(self, path: Path) -> None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb") as f:
            np.savez(f, ids=self.ids, logps=self.logps, identity=np.asarray(self.identity))
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: Path) -> ReferenceTable:
        with np.load(path, allow_pickle=False) as z:
            return cls(z["ids"], z["logps"], str(z["identity"]))


class PreferenceLoss:
    """loss(model, batch) for a pair batch: the summed per-pair loss of train.objective, and the
    sums the metrics rows report (rewards, reward accuracy and margin) since `reset`."""

    def __init__(self, spec: JobSpec, reference: ReferenceTable | None, lora: bool, live: Any = None):
        self.spec, self.reference, self.lora, self.live = spec, reference, lora, live
        self.needs_reference = spec.train.objective in NEEDS_REFERENCE
        self.sums = torch.zeros(5, dtype=torch.float64)  # pairs, chosen, rejected, correct, margin

    def reset(self) -> None:
        self.sums.zero_()

    def begin(self, model: Any, batches: list[Batch], device: torch.device) -> None:
        """Before a step's micro-batches, or an evaluation's: the sums reset (kto.KTOLoss also
        estimates its KL term over the batches here)."""
        self.reset()

    def reference_logps(self, model: Any, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        if not self.needs_reference:
            return None
        if self.reference is not None:
            assert batch.pair_ids is not None
            return self.reference.lookup(batch.pair_ids, batch.input_ids.device)
        live = self.live
        assert self.lora or live is not None, "a full fine-tune reads its reference from a table or a live copy"
        with torch.no_grad(), adapters_disabled(model) if live is None else contextlib.nullcontext():
            logps, _ = sequence_logps(model if live is None else live, batch)
        if live is not None:
            _reshard(live)
        chosen, rejected = logps.chunk(2)
        return chosen, rejected

    def __call__(self, model: Any, batch: Batch) -> torch.Tensor:
        reference = self.reference_logps(model, batch)
        logps, counts = sequence_logps(model, batch)
        (pc, pr), (nc, nr) = logps.chunk(2), counts.chunk(2)
        losses, chosen, rejected = pair_losses(self.spec, (pc, pr), reference, (nc, nr))
        margin = chosen - rejected
        self.sums += torch.stack(
            [
                torch.tensor(float(len(losses)), dtype=torch.float64),
                chosen.sum().double().cpu(),
                rejected.sum().double().cpu(),
                (margin > 0).sum().double().cpu(),
                margin.sum().double().cpu(),
            ]
        )
        return losses.sum()

    def row(self, group: Any, prefix: str = "") -> dict[str, float]:
        """The means over every rank's pairs since `reset` (collective over the gloo `group`: all
        ranks call it)."""
        sums = self.sums.clone()
        if group is not None:
            dist.all_reduce(sums, group=group)
        n = max(float(sums[0]), 1.0)
        return {
            f"{prefix}reward_chosen": float(sums[1]) / n,
            f"{prefix}reward_rejected": float(sums[2]) / n,
            f"{prefix}reward_accuracy": float(sums[3]) / n,
            f"{prefix}reward_margin": float(sums[4]) / n,
        }


def _reshard(model: Any) -> None:
    """FSDP2 keeps the root unit and the last layer gathered after a forward (for the backward,
    which frees them; see parallelize.fsdp2): the frozen reference has no backward, so they are
    freed here and it holds only its shards between forwards. FSDP1 frees them itself."""
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def build_live(spec: JobSpec, device: torch.device, world: int, kept: Path | None, log: Callable[[str], None]) -> Any:
    """train.preference.reference = 'live': the starting model again (model.name_or_path, or the
    init from job.seed: never a checkpoint, so a resume builds the same reference), frozen, in
    eval mode, sharded like the policy (build.build_model: FSDP2 on the same mesh shape, HSDP,
    or FSDP1; the fused log-probs where loss.attach applies), without an optimizer. The global
    RNG, which a resume has just restored, is left as it was (weights.init_unit forks it)."""
    t0 = time.perf_counter()
    live, counts = build_reference(spec, device, world, kept, max_id=-1)  # (reference_model is refused with 'live')
    shards = sum(_local(p).numel() * p.element_size() for p in live.parameters())
    fused = " (fused log-probs)" if hasattr(live, "clusterfsdp_logps") else ""
    log(
        f"reference: live, a frozen copy of the starting model sharded like the policy{fused} "
        f"({counts.total / 1e6:.2f}M params, {shards / 2**20:.1f} MiB of shards on this rank, plus the "
        f"units it gathers in each forward), built in {time.perf_counter() - t0:.1f} s"
    )
    return live


def _local(param: torch.Tensor) -> torch.Tensor:
    """A parameter's shard on this rank (FSDP2: the DTensor's local part; FSDP1 with
    use_orig_params: the parameter is already this rank's slice)."""
    to_local = getattr(param, "to_local", None)
    return to_local() if to_local is not None else param


# ---------------------------------------------------------------- the reference pass
def identity(samples: Any) -> str:
    """What a sample set reads (its prepared datasets and sample indexes), as a table records it."""
    parts = [samples] if isinstance(samples, PreparedSamples) else samples.parts
    return " ".join(p.identity for p in parts)


def all_pair_ids(samples: Any) -> list[int]:
    """Every pair of a sample set (a mixture's parts each), by pair id."""
    if isinstance(samples, PreparedSamples):
        return list(range(samples.count))
    return [(i << PART_SHIFT) | k for i, part in enumerate(samples.parts) for k in range(part.count)]


def read_pairs(samples: Any, ids: list[int]) -> Batch:
    """The pairs of these ids as one batch."""
    parts = samples.parts if not isinstance(samples, PreparedSamples) else [samples]
    out = []
    for pid in ids:
        sample = parts[pid >> PART_SHIFT].sample(pid & ((1 << PART_SHIFT) - 1))
        sample.pair_id = pid
        out.append(sample)
    return stack(out)


def compute_reference(
    model: Any, samples: Any, ids: list[int], rank: int, world: int, micro_batch: int, device: torch.device
) -> ReferenceTable:
    """The model's summed log-probs of the chosen and rejected answers of these pairs: each rank
    its share, in micro-batches (every rank runs as many forwards: FSDP gathers in each), gathered
    on every rank."""
    per_round = world * micro_batch
    padded = ids + ids[: (-len(ids)) % per_round] if ids else []
    mine: list[tuple[int, float, float]] = []
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(padded), per_round):
            chunk = padded[start + rank * micro_batch : start + (rank + 1) * micro_batch]
            batch = read_pairs(samples, chunk).to(device)
            chosen, rejected = sequence_logps(model, batch)[0].double().cpu().chunk(2)
            mine += list(zip(chunk, chosen.tolist(), rejected.tolist(), strict=True))
    model.train(was_training)
    gathered: list[Any] = [mine]
    if dist.is_initialized():
        gathered = [None] * world
        dist.all_gather_object(gathered, mine)
    table = {pid: (c, r) for part in gathered for pid, c, r in part}
    keys = np.asarray(sorted(table), np.int64)
    logps = np.asarray([table[int(k)] for k in keys], np.float64).reshape(-1, 2)
    return ReferenceTable(keys, logps, identity(samples))


class Objectives:
    """The training loss and the evaluation loss of a preference run (each with its own sums)."""

    def __init__(self, train: PreferenceLoss, evaluation: PreferenceLoss):
        self.train, self.eval = train, evaluation


def build_reference(
    spec: JobSpec, device: torch.device, world: int, kept: Path | None, max_id: int
) -> tuple[Any, ParamCount]:
    """The frozen reference, sharded like the policy (worker/build.py, no optimizer), and its
    parameter count: train.preference.reference_model (a local HuggingFace folder, hub ids
    resolved at submit), else the run's starting model as the policy is built (`kept`: the run's
    copy of its config). The reference table's pass and the live reference both build it here;
    `max_id` (the data's largest token id, -1: unchecked) must fit its vocabulary."""
    path = spec.train.preference.reference_model
    if path:
        model = dataclasses.replace(spec.model, name_or_path=path, config="", from_config={}, revision="")
        spec, kept = dataclasses.replace(spec, model=model), None
    built, config, counts = build_model(spec, device, world, token_ids(spec), kept=kept, frozen=True)
    if max_id >= config.vocab_size:
        key = "train.preference.reference_model" if path else "model"
        raise ValueError(f"{key}: token id {max_id} of the data does not fit its vocab_size {config.vocab_size}")
    return built, counts


def compute_tables(
    spec: JobSpec,
    sets: dict[str, Any],
    log: Callable[[str], None],
    device: torch.device,
    rank: int,
    world: int,
    checkpoints: Path,
    *,
    policy: Any = None,
    kept: Path | None = None,
    max_id: int = -1,
) -> dict[str, ReferenceTable]:
    """The reference table of each sample set, computed now and kept in the checkpoint folder
    (rank 0 writes): by the starting `policy` itself, or by a reference model built for the
    pass (train.preference.reference_model, or no `policy`: the reference job) and freed after.
    Every rank calls it (the forwards gather FSDP shards)."""
    reference = policy
    if policy is None or spec.train.preference.reference_model:
        t0 = time.perf_counter()
        reference, _ = build_reference(spec, device, world, kept, max_id)
        what = spec.train.preference.reference_model or "the starting model"
        log(f"reference model ({what}) built in {time.perf_counter() - t0:.1f} s")
    by = f"the reference model {spec.train.preference.reference_model}" if spec.train.preference.reference_model else (
        "the starting model")  # fmt: skip
    tables: dict[str, ReferenceTable] = {}
    try:
        for role, samples in sets.items():
            t0, path = time.perf_counter(), ckptfolder.reference_file(checkpoints, role)
            ids = all_pair_ids(samples)
            tables[role] = table = compute_reference(
                reference, samples, ids, rank, world, spec.train.micro_batch_size, device
            )
            if rank == 0:
                table.save(path)
            if dist.is_initialized():
                dist.barrier()
            log(
                f"reference log-probs of the {role} pairs: {len(ids):,} computed by {by} in "
                f"{time.perf_counter() - t0:.1f} s, kept in {path}"
            )
    finally:
        if reference is not policy:  # the policy trains alone: the reference's memory is given back
            del reference
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return tables
