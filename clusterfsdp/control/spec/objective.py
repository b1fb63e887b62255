"""Checks of train.objective and [train.preference], torch-free (run by `checks`).

A preference objective needs preference pairs (data.format = 'preference') and pairs need a
preference objective: each without the other would train silently on something else. An
objective that is not implemented yet is refused here, before anything is queued, with one line.
"""

from __future__ import annotations

import math

from .allowlists import sbatch_name_error
from .schema import JobSpec, Preference

# Objectives that compare the policy with a reference model's log-probs.
NEEDS_REFERENCE = ("dpo", "ipo")
# Objectives the worker implements (worker/preference.py); the rest of schema.OBJECTIVES is refused.
IMPLEMENTED = ("sft", "dpo", "ipo", "simpo", "orpo")
LABEL_SMOOTHING = ("dpo", "simpo")  # the objectives train.preference.label_smoothing acts on


def reference_table(spec: JobSpec) -> bool:
    """Whether the run reads a reference table (<checkpoints>/reference/): dpo and ipo without
    LoRA (LoRA's reference is its base with the adapters disabled, no table, no second model)."""
    return spec.train.objective in NEEDS_REFERENCE and spec.peft.method != "lora"


def reference_job(spec: JobSpec, slurm: bool) -> bool:
    """Whether the reference table is computed by a Slurm job of its own (control/refjob.py)
    rather than by the training job: train.preference.reference_pass 'job', or 'auto' on Slurm."""
    p = spec.train.preference.reference_pass
    return reference_table(spec) and (p == "job" or (p == "auto" and slurm))


def _reference_errors(spec: JobSpec) -> list[str]:
    """The reference keys set where there is no reference table to compute: silently ignored,
    they would suggest a reference the run never uses."""
    p, out = spec.train.preference, []
    if not reference_table(spec):
        why = (
            "with [peft] LoRA the reference is the base with the adapters disabled (no reference pass)"
            if spec.train.objective in NEEDS_REFERENCE
            else f"train.objective {spec.train.objective!r} compares with no reference model (only 'dpo' and 'ipo' do)"
        )
        given = [(k, v) for k, v in (("reference_pass", p.reference_pass != "auto"),
                                     ("reference_model", p.reference_model),
                                     ("reference_partition", p.reference_partition)) if v]  # fmt: skip
        return [f"train.preference.{given[0][0]}: {why}; remove it"] if given else []
    if p.reference_partition and p.reference_pass == "in_job":
        out.append("train.preference.reference_partition: reference_pass = 'in_job' queues no reference job; remove it")
    if problem := sbatch_name_error("train.preference.reference_partition", p.reference_partition):
        out.append(problem)
    return out


def errors(spec: JobSpec) -> list[str]:
    """train.objective against the data, and the [train.preference] values."""
    t, d = spec.train, spec.data
    objective, p = t.objective, t.preference
    pairs = d.format == "preference" or any(s.format == "preference" for s in d.sources)
    out: list[str] = []
    if objective not in IMPLEMENTED:
        return [
            f"train.objective: {objective!r} is not implemented yet (it needs unpaired completion + label data); "
            f"use one of {', '.join(repr(o) for o in IMPLEMENTED)}"
        ]
    out += _reference_errors(spec)
    keep_best = spec.checkpoint.keep_best
    if keep_best == "eval_reward_accuracy" and objective == "sft":
        out.append("checkpoint.keep_best: 'eval_reward_accuracy' needs a preference objective (train.objective)")
    elif keep_best == "eval_reward_accuracy" and spec.train.early_stopping.metric:
        out.append(
            "train.early_stopping.metric: the run judges its evaluations by checkpoint.keep_best = "
            "'eval_reward_accuracy'; early stopping on eval_loss would judge another metric (unset one of them)"
        )
    if objective == "sft":
        if pairs:
            out.append(
                "data.format: 'preference' pairs train with a preference objective: set train.objective to "
                "'dpo', 'ipo', 'simpo' or 'orpo'"
            )
        return out
    if d.source != "files" or not pairs:
        out.append(
            f"train.objective: {objective!r} trains on preference pairs: set data.source = 'files' and "
            "data.format = 'preference' (records with prompt, chosen and rejected)"
        )
    mixed = [i for i, s in enumerate(d.sources) if (s.format or d.format) != "preference"]
    if pairs and mixed:
        out.append(f"data.sources[{mixed[0]}].format: preference pairs cannot be mixed with other formats")
    if d.packing != "auto" and pairs:
        out.append(f"data.packing: {d.packing!r} does not apply to preference pairs (one pair a sample): leave 'auto'")
    if not (math.isfinite(p.beta) and p.beta > 0):
        out.append(f"train.preference.beta: must be a number > 0, found {p.beta!r}")
    if not 0 <= p.label_smoothing < 0.5:
        out.append(f"train.preference.label_smoothing: expected a number in [0, 0.5), found {p.label_smoothing!r}")
    elif p.label_smoothing and objective not in LABEL_SMOOTHING:
        out.append(
            f"train.preference.label_smoothing: applies to 'dpo' and 'simpo' only, not {objective!r} (set it to 0)"
        )
    if not math.isfinite(p.simpo_gamma):
        out.append(f"train.preference.simpo_gamma: must be a finite number, found {p.simpo_gamma!r}")
    elif p.simpo_gamma != Preference().simpo_gamma and objective != "simpo":
        out.append(f"train.preference.simpo_gamma: applies to 'simpo' only, not {objective!r} (remove it)")
    if spec.eval.samples and not spec.eval.samples_file:
        out.append("eval.samples: preference pairs give no prompts to generate from: set eval.samples_file")
    return out
