"""The objectives of train.objective, built with their reference (`start`): a preference loss
(worker/preference.py) or KTO's (worker/kto.py, which builds on it), each over the reference
table of its sample set or a live frozen copy. Apart from both loss modules so that neither
imports the other back."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..core import ckptfolder
from ..core.spec import JobSpec
from ..core.spec.objective import NEEDS_REFERENCE
from .kto import KTOLoss
from .preference import Objectives, PreferenceLoss, ReferenceTable, build_live, compute_tables, identity


def start(
    spec: JobSpec,
    model: Any,
    sets: dict[str, Any],
    checkpoints: Path,
    resumed: bool,
    rank: int,
    world: int,
    device: torch.device,
    log: Callable[[str], None],
    lora: bool,
    kept: Path | None = None,
    max_id: int = -1,
) -> Objectives:
    """The objectives of train.objective; for dpo and ipo without LoRA first their reference:
    with train.preference.reference = 'live' the frozen copy (`build_live`; `kept`: the run's
    copy of the model config, as for the policy), else the reference table of each sample set
    (`sets`: role -> samples): read from the checkpoint folder (the reference job wrote it, or an
    earlier attempt), or computed now (`compute_tables`: by the model as it starts, or
    train.preference.reference_model; before the first step only: a resumed policy is no
    reference)."""
    tables: dict[str, ReferenceTable | None] = {"train": None, "eval": None}
    needs, mode = spec.train.objective in NEEDS_REFERENCE, spec.train.preference.reference
    if needs and lora:
        log(f"reference: {mode}: with LoRA the base with the adapters disabled (no second model, no table)")
    loss = KTOLoss if spec.train.objective == "kto" else PreferenceLoss  # kto: the rows hold (completion, KL)
    if needs and not lora and mode == "live":
        live = build_live(spec, device, world, kept, log)
        return Objectives(loss(spec, None, lora, live), loss(spec, None, lora, live))
    if needs and not lora:
        missing: dict[str, Any] = {}
        for role, samples in sets.items():
            path = ckptfolder.reference_file(checkpoints, role)
            if not path.is_file():
                missing[role] = samples
                continue
            tables[role] = loaded = ReferenceTable.load(path)
            if loaded.identity != identity(samples):
                raise RuntimeError(
                    f"{path}: the reference log-probs were computed over other {role} pairs ({loaded.identity}; "
                    f"this attempt reads {identity(samples)}: the data, data.seq_len or the split changed): "
                    "a preference run cannot change its pairs; start a new run"
                )
            log(f"reference log-probs of the {role} pairs: read {len(loaded.ids):,} from {path}")
        if missing:
            path = ckptfolder.reference_file(checkpoints, next(iter(missing)))
            if resumed:
                raise RuntimeError(
                    f"{path} is missing: the reference log-probs are computed before the run's first step, "
                    "and this run has trained since; start a new run"
                )
            if spec.train.preference.reference_pass == "job":
                raise RuntimeError(
                    f"{path} is missing: train.preference.reference_pass = 'job' computes it in the reference job "
                    f"({spec.job.name}-reference), which did not write it; submit again, or set reference_pass = "
                    "'in_job'"
                )
            tables.update(compute_tables(spec, missing, log, device, rank, world, checkpoints, policy=model, kept=kept,
                                         max_id=max_id))  # fmt: skip
    return Objectives(loss(spec, tables["train"], lora), loss(spec, tables["eval"], lora))
