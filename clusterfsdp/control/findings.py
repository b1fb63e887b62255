"""The doctor's causes (`Finding`) and what each advises (docs/recovery.md, "Asking the doctor"):
the words the user reads after `next`, kept apart from the reading and ordering of the evidence
(control/doctor.py) so that each cause's advice is in one place."""

from __future__ import annotations

from enum import StrEnum

from ..core.value import value


class Finding(StrEnum):
    """The classified cause of a failure, as the doctor names it (finer than `Cause`, which is
    what the restart policy needs: an out-of-memory and a data error are both `error` there)."""

    OOM = "oom"  # out of memory on the GPU (or the host)
    COLLECTIVE = "collective"  # an NCCL/gloo error: a lost peer, a broken connection
    HANG = "hang"  # a rank stopped making progress; the others waited in a collective
    NODE_FAILURE = "node_failure"
    PREEMPTED = "preempted"
    TIME_LIMIT = "time_limit"
    DATA_ERROR = "data_error"
    NUMERICAL = "numerical"  # the numerical guard stopped the run: the loss or the gradients went NaN/Inf or spiked
    BAD_CONFIG = "bad_config"  # a Python error before the first step: the config, a file, the model
    PYTHON_ERROR = "python_error"  # a Python error during training, in the model or user code
    BUG = "clusterfsdp_bug"  # an exception that clusterfsdp's own code did not raise on purpose
    RANK_KILLED = "rank_killed"  # a rank died without an exception (SIGKILL, the OOM killer, a crash)
    CANCELLED = "cancelled"
    PREFLIGHT = "preflight"  # a node failed the pre-flight checks (GPUs, free space, network) and was left out
    UNKNOWN = "unknown"  # it ended badly and the run folder does not say why
    NONE = "none"  # nothing failed (completed, or still going)


@value(frozen=True)
class Numbers:
    """What a `numerical` finding names: the step the guard gave up at, the first bad step of
    that streak, the lr there, the precision, and the newest checkpoint before the streak."""

    step: int | None = None
    first_bad: int | None = None
    lr: float | None = None  # at `step`, on the lr curve
    train_lr: float | None = None  # the job's train.lr (the curve's peak), what a resume sets lower
    mixed_precision: str = ""
    model_dtype: str = ""
    checkpoint: int | None = None

    def describe(self) -> str:
        """'step 5 (bad since step 4), lr 3.40e-01 (train.lr 0.9), fsdp.mixed_precision fp16, model.dtype fp32'."""
        parts = [f"step {self.step}" + (f" (bad since step {self.first_bad})" if self.first_bad is not None else "")]
        if self.lr is not None:
            parts.append(f"lr {self.lr:.2e}" + (f" (train.lr {self.train_lr:g})" if self.train_lr else ""))
        if self.mixed_precision:
            parts.append(f"fsdp.mixed_precision {self.mixed_precision}")
        if self.model_dtype:
            parts.append(f"model.dtype {self.model_dtype}")
        return ", ".join(parts)


@value(frozen=True)
class Context:
    """What the advice of a finding names besides the run: `detail` the nodes or host, `repeats`
    the incarnations that failed with the same error at the same step, `frame` and `folder` a
    bug's innermost frame and the run folder to report, `numbers` a numerical finding's."""

    run_id: str
    detail: str = ""
    repeats: int = 1
    frame: str = ""
    folder: str = ""
    numbers: Numbers | None = None


# A clusterfsdp module and the setting that turns off the feature it serves: a bug there can be
# stepped around until it is fixed.
WORKAROUNDS = {
    "clusterfsdp/worker/generate.py": "eval.samples = 0 (no generated samples at evaluations)",
    **{  # the trackers' sink, what they share, and one module per tracker
        f"clusterfsdp/worker/{module}.py": "log.trackers = [] (no experiment trackers)"
        for module in ("trackers", "trackerbase", "tbtracker", "wandbtracker", "mlflowtracker")
    },
    "clusterfsdp/worker/watchdog.py": "train.watchdog.enabled = false",
    "clusterfsdp/worker/heartbeat.py": "train.watchdog.enabled = false",
    "clusterfsdp/worker/preflight.py": "slurm.preflight = false",
    "clusterfsdp/worker/checkpoint.py": "checkpoint.async = false",
    "clusterfsdp/worker/parallelize.py": "fsdp.compile = false and fsdp.activation_checkpointing = false",
}


def next_steps(finding: Finding, ctx: Context) -> list[str]:
    """What to do next about `finding`, most useful first (`status` shows the first)."""
    resume = f"clusterfsdp resume {ctx.run_id}"
    detail = ctx.detail
    if finding is Finding.NUMERICAL:
        return _numerical(ctx.numbers or Numbers(), resume)
    if finding is Finding.BUG:
        where = ctx.frame.rpartition(":")[0]
        workaround = WORKAROUNDS.get(where, "")
        return [
            f"a bug in clusterfsdp ({ctx.frame}), not in your job: please report it with the run folder "
            f"{ctx.folder} (and `clusterfsdp doctor {ctx.run_id} --json`)",
            f"until it is fixed: {resume} --set {workaround}" if workaround
            else f"until it is fixed: change the setting that leads there, then {resume}",
        ]  # fmt: skip
    if finding is Finding.PYTHON_ERROR:
        again = (
            f"it happened at the same step in {ctx.repeats} attempts: a restart alone will not get past it"
            if ctx.repeats > 1
            else "it happened once: a resume may get past it if it came from outside the code (a disk, a GPU)"
        )
        return [f"fix the code in the innermost frame above; {again}", f"then {resume}"]
    return {
        Finding.OOM: [
            f"{resume} --set train.micro_batch_size=N  (smaller; raise train.grad_accum to keep the global batch)",
            "or turn on activation checkpointing / use more GPUs (each rank then holds a smaller shard)",
        ],
        Finding.COLLECTIVE: [
            "look at the rank named first: a lost peer is usually the consequence of a rank that died or hung",
            f"{resume}  (it resumes from the newest checkpoint)",
        ],
        Finding.HANG: [
            "read the stuck frame: a data worker, a file system or a GPU that stopped answering",
            f"{resume} --set slurm.exclude=...  when the node is suspect" if detail else f"{resume}",
        ],
        Finding.NODE_FAILURE: [
            f"nothing, if an automatic restart followed; else {resume} (the failed node is excluded)",
            f"ask the admins about {detail}" if detail else "ask the admins about the node",
        ],
        Finding.PREEMPTED: [
            "nothing: the run saved and comes back by itself",
            "use a partition that is not preempted, or raise slurm.signal_grace_s if the save was cut off",
        ],
        Finding.TIME_LIMIT: [
            "nothing: the run saved and comes back by itself",
            f"{resume} --set slurm.time=MINUTES  for fewer requeues",
        ],
        Finding.DATA_ERROR: [
            "fix or remove the record named above (clusterfsdp validate checks only the first record of each file)",
            f"then {resume}",
        ],
        Finding.BAD_CONFIG: [
            "fix the job (the error above names the key, the file or the model); it failed before the first step",
            f"then {resume} --set KEY=VALUE",
        ],
        Finding.RANK_KILLED: [
            "check the node's memory (the OOM killer) and `dmesg`/`sacct` for the signal",
            f"{resume}  (it resumes from the newest checkpoint)",
        ],
        Finding.CANCELLED: [f"{resume}  continues from the newest checkpoint (or starts, if it never ran)"],
        Finding.PREFLIGHT: [
            f"nothing, if an automatic restart followed without {detail or 'the node'}; else {resume}",
            "fix the node (free space, GPUs, network) or tell the admins; slurm.preflight = false skips the checks",
        ],
        Finding.UNKNOWN: [f"clusterfsdp logs {ctx.run_id} --rank R  for each rank, and the submitit/ logs"],
        Finding.NONE: [],
    }[finding]


def _numerical(n: Numbers, resume: str) -> list[str]:
    """A lower lr from the checkpoint before the bad steps, then a wider precision."""
    peak = n.train_lr or n.lr
    lr = f" --set train.lr={peak / 10:.3g}" if peak else " --set train.lr=LOWER"
    first = f"the first bad step {n.first_bad}" if n.first_bad is not None else "the bad steps"
    if n.checkpoint is not None:
        out = [f"{resume} --step {n.checkpoint}{lr}  (back to the newest checkpoint before {first}, with a lower lr)"]
    else:
        out = [
            f"{resume}{lr}  (a lower lr; no checkpoint before {first} to roll back to: set "
            "checkpoint.every_steps so that there is one next time)"
        ]
    if n.mixed_precision == "fp16":
        out.append(f"or {resume} --set fsdp.mixed_precision=bf16  (fp16 overflows above 65504; bf16 has fp32's "
                   "range), or fp32")  # fmt: skip
    elif n.mixed_precision == "bf16":
        out.append(f"or {resume} --set fsdp.mixed_precision=fp32  (bf16 keeps 8 bits of mantissa)")
    out.append("look at the loss and grad_norm before it: `clusterfsdp status`, the TUI's charts (a longer "
               "train.warmup also helps a loss that diverges early)")  # fmt: skip
    return out
