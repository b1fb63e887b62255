"""The sections that say how a job trains: `[train]` (with `[train.early_stopping]`,
`[train.preference]`, `[train.guard]`, `[train.watchdog]`), `[fsdp]` and `[peft]`."""

# No `from __future__ import annotations` here: the codec resolves these annotations on every
# load (`schema.hints`), and strings would be compiled one by one each time (start-up, issue 25 item 3).

from typing import Literal

from ..value import value
from .docfield import F


@value
class EarlyStopping:
    """[train.early_stopping]: stop when the eval loss (or a benchmark score) stops improving."""

    metric: str = F(
        "",
        "'eval_loss' ends the run when it stops improving; a benchmark score 'bench/<task>/<metric>' (a task of "
        "[benchmarks]) when its results, read as they land, stop improving; '': off.",
    )
    patience: int = F(
        3, "Evaluations (or benchmark results) in a row without an improvement of min_delta that end the run."
    )
    min_delta: float = F(0.0, "How much better than the best so far a score must be to count as an improvement.")


@value
class Guard:
    """[train.guard]: skip steps with a NaN/Inf or spiking loss, roll back after several."""

    nonfinite: bool = F(
        True,
        "Skip a step whose loss or gradient norm is NaN or Inf on any rank (no optimizer update; the step and "
        "its samples count as done). Reads the global grad norm back once per step.",
    )
    spike_loss: float = F(
        0.0,
        "Skip a step whose loss (averaged over the ranks) is above this many times the median of the last "
        "spike_window accepted steps (e.g. 3.0; 0: off). Adds one small all-reduce per step.",
    )
    spike_grad_norm: float = F(
        0.0, "Skip a step whose gradient norm is above this many times the median of the last spike_window (0: off)."
    )
    spike_window: int = F(
        20, "Accepted steps the spike checks compare with; they start once this many are seen (after each start)."
    )
    warn_rise: float = F(
        3.0,
        "Warn (log line, `warning` event, a line of `status`) once when a logged loss is above this many times "
        "the lowest logged loss so far and at least 1.0 above it: a run that diverges slowly (lr too high) is "
        "never a spike, and it would otherwise complete with no word (0: off). Costs nothing: it reads the "
        "metrics rows.",
    )
    rollback_after: int = F(
        3,
        "Skipped steps in a row after which the run goes back to the newest checkpoint before them and skips the "
        "samples those steps read, for good (recorded in later checkpoints); 0: never roll back. Without such a "
        "checkpoint, or when steps go bad again no later than before the last rollback, the run fails.",
    )


@value
class Watchdog:
    """[train.watchdog]: when a rank counts as hung or late."""

    enabled: bool = F(True, "Watch every rank's heartbeat for hangs and stragglers (docs/recovery.md).")
    hang_min_s: float = F(
        60.0,
        "A run whose ranks made no step for max(hang_min_s, hang_factor x the slowest recent step) is hung: "
        "the stacks are dumped into diagnostics/, the attempt is killed and restarted from the last checkpoint.",
    )
    hang_factor: float = F(10.0, "How many of the slowest recent steps without progress make a hang.")
    startup_s: float = F(900.0, "Hang timeout in start-up and until the first steps are measured.")
    data_prep_s: float = F(3600.0, "Hang timeout while the training data is prepared.")
    model_load_s: float = F(1800.0, "Hang timeout while the model is built, filled and restored from a checkpoint.")
    eval_s: float = F(900.0, "Hang timeout during an evaluation.")
    save_s: float = F(900.0, "Hang timeout during a checkpoint save.")
    straggler_factor: float = F(
        1.5,
        "A rank whose own step time (before it reaches the others) stays above this many times the others' "
        "median is a straggler: a `straggler` event and a warning, no restart (0: off).",
    )
    straggler_checks: int = F(5, "Watchdog polls in a row (about 2 s each) a rank must be behind to be a straggler.")


OBJECTIVES = ("sft", "dpo", "ipo", "simpo", "orpo", "kto")
TWO_ROWS = ("preference", "unpaired")  # the data formats whose samples are two documents (packing 'pairs')


@value
class Preference:
    """[train.preference]: the knobs of the preference objectives (train.objective other than 'sft')."""

    beta: float = F(
        0.1,
        "dpo, ipo: how far the policy may move from the reference (dpo: the scale of the log-ratio in the "
        "sigmoid; ipo: the target margin is 1 / (2 beta)); simpo: the scale of the length-normalized reward; "
        "orpo: the weight of the odds-ratio term (lambda in the paper); kto: the scale of the log-ratio (minus "
        "the KL estimate) in the sigmoid.",
    )
    label_smoothing: float = F(
        0.0,
        "dpo, simpo: the assumed probability that a pair's preference is flipped (conservative DPO), in [0, 0.5).",
    )
    simpo_gamma: float = F(0.5, "simpo: the target reward margin (gamma in the paper).")
    reference: Literal["start", "live"] = F(
        "start",
        "dpo, ipo, kto without [peft]: where the reference log-probs come from. 'start': the model as it starts, its "
        "log-probs over every training and eval pair computed once before the first step and kept in the "
        "checkpoint folder (training holds only the policy). 'live': a frozen second copy of the starting model "
        "(model.name_or_path, or the seeded init), built and sharded like the policy and never saved (a resume "
        "builds it again: model.name_or_path must still be readable), its log-probs computed each micro-batch: "
        "for data that changes each epoch, at the memory of a second model's shards. With LoRA both are the base "
        "with the adapters disabled (no second model, no table). simpo and orpo use no reference: 'live' is "
        "refused.",
    )
    desirable_weight: float = F(1.0, "kto: the weight of the desirable examples' losses (lambda_D in the paper).")
    undesirable_weight: float = F(1.0, "kto: the weight of the undesirable examples' losses (lambda_U in the paper).")
    reference_pass: Literal["auto", "job", "in_job"] = F(
        "auto",
        "dpo, ipo, kto without LoRA: where the reference log-probs of the train and eval pairs are computed, once, "
        "before the first step: 'job' a Slurm job of its own (the training job's nodes, GPUs and container, "
        "named <job.name>-reference, after the data prepare array) that the training job waits for "
        "(--dependency=afterok), so training holds only the policy; 'in_job' the training job, before its "
        "first step; 'auto' 'job' on Slurm, 'in_job' otherwise (the local executor, a notebook's srun, a sweep's "
        "points, a dry run; 'job' is refused for the first three). "
        "Either way the tables are kept in <checkpoints>/reference/ and every attempt reads them.",
    )
    reference_model: str = F(
        "",
        "dpo, ipo, kto without LoRA: the frozen reference model (empty: the run's starting model, model.name_or_path "
        "or its random init). A local HuggingFace folder (an exported checkpoint: `clusterfsdp export`) or a "
        "hub id, resolved and checked like model.name_or_path; its vocabulary must fit the data's token ids. "
        "With reference_pass = 'in_job' the training job builds it before the policy trains and frees it "
        "before the first step.",
    )
    reference_partition: str = F(
        "",
        "Slurm partition of the reference job (reference_pass 'job' or 'auto' on Slurm; empty: slurm.partition).",
    )


@value
class TrainSection:
    """[train]: steps or epochs, batch, optimizer and learning-rate schedule."""

    steps: int = F(100, "Optimizer steps in total (a resumed run continues to this number); with train.epochs: 0.")
    epochs: float = F(
        0.0,
        "Passes over the training samples instead of train.steps (may be fractional; 0: unset, train.steps "
        "counts). The job derives the steps from the prepared training set (after packing and the eval hold-out) "
        "and the global batch, rounded up; giving both train.steps and train.epochs is an error.",
    )
    micro_batch_size: int = F(8, "Samples per worker per forward pass.")
    grad_accum: int = F(1, "Micro-batches accumulated per optimizer step.")
    lr: float = F(3e-4, "Peak learning rate (AdamW).")
    warmup: int = F(10, "Linear warmup steps.")
    schedule: Literal["cosine", "linear", "constant"] = F("cosine", "Decay after warmup.")
    min_lr_ratio: float = F(0.1, "Final learning rate as a fraction of `lr`.")
    weight_decay: float = F(0.1, "AdamW weight decay.")
    max_grad_norm: float = F(1.0, "Gradient clipping norm over all shards (0: off).")
    log_every: int = F(10, "Write a metrics line every N steps.")
    resume_schedule: Literal["continue", "keep", "rewarm", "stretch"] = F(
        "continue",
        "What a resume does to the learning-rate curve when steps, warmup, schedule or min_lr_ratio changed since "
        "the checkpoint: continue = from the lr at the resumed step down to the end lr at the new steps (never "
        "higher; an extended finished run stays at its end lr); keep = the checkpoint's curve unchanged; rewarm = "
        "warm up again to `lr`, then decay to the new end; stretch = the curve planned for the new settings from "
        "step 0 (the lr may jump).",
    )
    objective: Literal["sft", "dpo", "ipo", "simpo", "orpo", "kto"] = F(
        "sft",
        "'sft': next-token cross-entropy on the trained tokens. Preference training on data.format = "
        "'preference' pairs: 'dpo' (sigmoid, train.preference.label_smoothing), 'ipo', 'simpo' and 'orpo' "
        "(no reference model). dpo and ipo compare with a reference: with [peft] LoRA the base with the "
        "adapters disabled; otherwise the model as it starts (or train.preference.reference_model), its "
        "log-probs over the training and eval pairs computed once (train.preference.reference_pass), or a frozen "
        "copy of it (train.preference.reference). 'kto' (Kahneman-Tversky) trains on data.format = 'unpaired' "
        "examples (a completion labelled desirable or not) against the same reference, with TRL's KL estimate "
        "from mismatched prompt/completion pairs (train.preference desirable_weight, undesirable_weight).",
    )
    early_stopping: EarlyStopping = F(
        EarlyStopping(),
        "Stop when the eval metric (needs [eval]) or a benchmark score stops improving: the run saves and ends "
        "COMPLETED, with the reason in its completed event and `status`.",
    )
    preference: Preference = F(Preference(), "Knobs of the preference objectives (train.objective).")
    guard: Guard = F(
        Guard(),
        "The numerical guard: steps with a NaN/Inf or spiking loss or grad norm are skipped on every rank and "
        "recorded (a bad_step event, a metrics row with `skipped`); repeated ones roll back (docs/recovery.md).",
    )
    watchdog: Watchdog = F(
        Watchdog(),
        "Hang and straggler watchdog: every rank's heartbeat is watched by one process per node; the collective "
        "timeout follows the same rule (plus 60 s, so the watchdog acts first).",
    )


@value
class FsdpSection:
    """[fsdp]: sharding, FSDP version, mixed precision, activation checkpointing, compile."""

    version: Literal[1, 2] = F(2, "2 = FSDP2 `fully_shard` (default); 1 = FullyShardedDataParallel.")
    sharding: Literal["hybrid", "full", "grad_op", "none"] = F(
        "hybrid",
        "hybrid = shard inside a node, replicate across nodes (HSDP); full = shard over all ranks; "
        "grad_op = keep params gathered after forward (ZeRO-2); none = replicate (DDP-like).",
    )
    reshard_after_forward: bool = F(True, "Free gathered params after forward (less memory, one more all-gather).")
    mixed_precision: Literal["bf16", "fp16", "fp32"] = F("bf16", "Compute dtype; gradients are reduced in fp32.")
    activation_checkpointing: bool = F(False, "Recompute each decoder layer in backward to save memory.")
    compile: bool = F(False, "torch.compile each decoder layer (and the loss).")
    cpu_offload: bool = F(False, "Keep sharded params and optimizer state in CPU memory.")


@value
class PeftSection:
    """[peft]: LoRA adapters (Hugging Face peft) instead of a full fine-tune."""

    method: Literal["none", "lora"] = F(
        "none",
        "'lora': fine-tune low-rank adapters (Hugging Face peft) on a frozen base model; checkpoints hold only the "
        "adapters and their optimizer state, and `export` writes a PEFT adapter folder (`--merge`: a full model). "
        "'none': full fine-tune.",
    )
    r: int = F(16, "LoRA rank.")
    alpha: int = F(32, "LoRA alpha: the adapters' output is scaled by alpha / r (alpha / sqrt(r) with use_rslora).")
    dropout: float = F(0.0, "Dropout on the adapters' input, in [0, 1).")
    target_modules: list[str] | str = F(
        "all-linear",
        "Modules that get adapters: names (the last part of the module name, e.g. ['q_proj', 'v_proj']), or "
        "'all-linear' (every linear layer of the decoder, not the output layer). Checked against the model's "
        "config before queueing when its family is known.",
    )
    modules_to_save: list[str] = F(
        [],
        "Modules trained in full beside the adapters (e.g. ['norm']); saved in checkpoints and the adapter folder. "
        "Not the output layer nor tied embeddings.",
    )
    use_rslora: bool = F(False, "Rank-stabilized LoRA: scale by alpha / sqrt(r) instead of alpha / r.")
    use_dora: bool = F(
        False,
        "Weight-decomposed LoRA (DoRA): not supported on sharded models (its magnitude needs each whole base weight).",
    )
    base_dtype: Literal["", "bfloat16"] = F(
        "",
        "dtype the frozen base is kept in: '' the same as model.dtype; 'bfloat16' half the memory of a float32 "
        "base while the adapters and modules_to_save train in model.dtype (float32: fp32 weights, gradients and "
        "AdamW moments). Compute follows fsdp.mixed_precision ('fp32' gathers the bf16 base as fp32 for each "
        "layer). Another dtype than model.dtype needs FSDP2 (FSDP1 flattens a unit into one dtype). `export "
        "--merge` merges in model.dtype and writes the base's dtype unless --dtype.",
    )
