"""Checks of train.objective and [train.preference], torch-free (run by `crossfield`).

A preference objective needs preference pairs (data.format = 'preference'), 'kto' unpaired
examples (data.format = 'unpaired'), and such data needs its objective: each without the other
would train silently on something else. An
objective that is not implemented yet is refused here, before anything is queued, with one line.
"""

from __future__ import annotations

import math

from .allowlists import sbatch_name_error
from .schema import JobSpec, Preference

# Objectives that compare the policy with a reference model's log-probs.
NEEDS_REFERENCE = ("dpo", "ipo", "kto")
# Objectives the worker implements (worker/preference.py, worker/kto.py); the rest of schema.OBJECTIVES is refused.
IMPLEMENTED = ("sft", "dpo", "ipo", "simpo", "orpo", "kto")
LABEL_SMOOTHING = ("dpo", "simpo")  # the objectives train.preference.label_smoothing acts on


def reference_table(spec: JobSpec) -> bool:
    """Whether the run reads a reference table (<checkpoints>/reference/): dpo and ipo without
    LoRA (LoRA's reference is its base with the adapters disabled, no table, no second model)
    with train.preference.reference = 'start' ('live' computes its log-probs each micro-batch)."""
    p = spec.train.preference
    return spec.train.objective in NEEDS_REFERENCE and spec.peft.method != "lora" and p.reference == "start"


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
            f"train.objective {spec.train.objective!r} compares with no reference model (only 'dpo' and 'ipo' do)"
            if spec.train.objective not in NEEDS_REFERENCE
            else "with [peft] LoRA the reference is the base with the adapters disabled (no reference pass)"
            if spec.peft.method == "lora"
            else "reference = 'live' computes the reference log-probs each micro-batch (no reference pass)"
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
    # the data format the objective trains on: unpaired examples for kto, pairs for the others
    wanted = "unpaired" if objective == "kto" else "preference"
    formats = {d.format, *(s.format or d.format for s in d.sources)} if d.sources else {d.format}
    pairs = bool(formats & {"preference", "unpaired"})
    out: list[str] = []
    if objective not in IMPLEMENTED:
        return [
            f"train.objective: {objective!r} is not implemented yet (it needs unpaired completion + label data); "
            f"use one of {', '.join(repr(o) for o in IMPLEMENTED)}"
        ]
    out += _reference_errors(spec)
    keep_best = spec.checkpoint.keep_best
    if keep_best == "eval_reward_accuracy" and objective in ("sft", "kto"):
        out.append(
            "checkpoint.keep_best: 'eval_reward_accuracy' needs a pair objective (train.objective 'dpo', 'ipo', "
            "'simpo' or 'orpo'; kto's unpaired examples have no accuracy): use 'eval_loss'"
        )
    elif keep_best == "eval_reward_accuracy" and spec.train.early_stopping.metric == "eval_loss":
        out.append(
            "train.early_stopping.metric: the run judges its evaluations by checkpoint.keep_best = "
            "'eval_reward_accuracy'; early stopping on eval_loss would judge another metric (unset one of them)"
        )
    if objective == "sft":
        if "preference" in formats:
            out.append(
                "data.format: 'preference' pairs train with a preference objective: set train.objective to "
                "'dpo', 'ipo', 'simpo' or 'orpo'"
            )
        elif "unpaired" in formats:
            out.append("data.format: 'unpaired' examples train with train.objective = 'kto'")
        return out
    if d.source != "files" or wanted not in formats:
        what = (
            "unpaired examples: set data.source = 'files' and data.format = 'unpaired' (records with prompt, "
            "completion and a true/false label)"
            if wanted == "unpaired"
            else "preference pairs: set data.source = 'files' and data.format = 'preference' (records with prompt, "
            "chosen and rejected)"
        )
        out.append(f"train.objective: {objective!r} trains on {what}")
    mixed = [i for i, s in enumerate(d.sources) if (s.format or d.format) != wanted]
    if wanted in formats and mixed:
        out.append(f"data.sources[{mixed[0]}].format: {wanted} data cannot be mixed with other formats")
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
    if p.reference == "live" and objective not in NEEDS_REFERENCE:
        out.append(
            f"train.preference.reference: 'live' applies to 'dpo', 'ipo' and 'kto' only; {objective!r} uses no "
            "reference model (remove it)"
        )
    if not math.isfinite(p.simpo_gamma):
        out.append(f"train.preference.simpo_gamma: must be a finite number, found {p.simpo_gamma!r}")
    elif p.simpo_gamma != Preference().simpo_gamma and objective != "simpo":
        out.append(f"train.preference.simpo_gamma: applies to 'simpo' only, not {objective!r} (remove it)")
    for key in ("desirable_weight", "undesirable_weight"):
        value = getattr(p, key)
        if not (math.isfinite(value) and value > 0):
            out.append(f"train.preference.{key}: must be a number > 0, found {value!r}")
        elif value != 1.0 and objective != "kto":
            out.append(f"train.preference.{key}: applies to 'kto' only, not {objective!r} (remove it)")
    if spec.eval.samples and not spec.eval.samples_file:
        out.append(f"eval.samples: {wanted} data gives no prompts to generate from: set eval.samples_file")
    return out
