"""The job spec: typed dataclasses for every section of job.toml, loading with
field-level errors, command-line overrides, cross-field checks and TOML output.

Everything here is pure Python (no torch), so `validate`, `init` and the TUI's
compose form stay fast. Each field carries its docstring in `metadata["doc"]`;
`clusterfsdp schema` and the starter file written by `clusterfsdp init` are
generated from it, so the documentation cannot drift from the code.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import re
import tomllib
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import tomli_w

from . import secretenv
from .runroot import default_run_root


class SpecError(ValueError):
    """A job spec that cannot be used. `errors` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


def F(default: Any, doc: str, *, key: str | None = None, secret: bool = False) -> Any:
    """A schema field with its docstring (and TOML key when it is not a valid Python name)."""
    meta = {"doc": doc, "key": key}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass
class JobSection:
    name: str = F("job", "Job name; runs go to <run_root>/<name>/<run id>/ and it names the Slurm job.")
    run_root: str = F(
        "",
        "Folder that holds run folders (relative to this file); on a cluster it must be on the shared filesystem. "
        "Empty: $CLUSTERFSDP_RUN_ROOT, else run_root in ~/.config/clusterfsdp/config.toml, else ./runs beside "
        "this file (the same default `runs`, `status` and the TUI use).",
    )
    seed: int = F(0, "Seed for model init, data order and dropout; same seed + same world size = same losses.")


@dataclass
class ContainerSection:
    kind: Literal["none", "pyxis", "apptainer", "oci"] = F(
        "none",
        "Run the workers in a container: 'pyxis' (srun --container-image, NVIDIA clusters with pyxis/enroot), "
        "'apptainer' (apptainer exec), 'oci' (Slurm's own srun --container=BUNDLE through oci.conf); 'none': "
        "the Python that submits.",
    )
    image: str = F(
        "",
        "pyxis: an image ('nvcr.io#nvidia/pytorch:24.05-py3') or a .sqsh file; apptainer: a .sif file (or "
        "'docker://...'); oci: the bundle folder (config.json + rootfs/), an absolute path that every node sees.",
    )
    python: str = F(
        "python3",
        "The Python inside the image that runs the workers; it needs clusterfsdp (same version) and torch installed.",
    )
    mounts: list[str] = F(
        [],
        "Host folders to mount, 'SRC:DST' or 'SRC:DST:ro' (pyxis --container-mounts, apptainer --bind). The run "
        "root and checkpoint.dir are always mounted at their own paths. oci: the bundle's config.json mounts.",
    )
    workdir: str = F("", "Working directory inside the container (empty: the image's default). pyxis and apptainer.")
    options: list[str] = F(
        [],
        "Further launcher options, e.g. ['--no-container-mount-home'] (pyxis) or ['--cleanenv'] (apptainer).",
    )


@dataclass
class SlurmSection:
    partition: str = F("", "Slurm partition (empty: the cluster's default).")
    account: str = F("", "Slurm account to charge (empty: your default).")
    qos: str = F("", "Slurm QOS (empty: default).")
    nodes: int = F(1, "Number of nodes.")
    gpus_per_node: int = F(0, "GPUs per node; one worker process per GPU. 0 for CPU-only jobs.")
    tasks_per_node: int = F(0, "Worker processes per node; 0 means one per GPU (or 1 without GPUs).")
    cpus_per_task: int = F(0, "CPUs per worker process (0: Slurm's default).")
    mem_gb: float = F(0.0, "Memory per node in GB (0: Slurm's default).")
    time: int | str = F(
        60, "Time limit: minutes (int) or Slurm's forms 'MM', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS'."
    )
    constraint: str = F("", "Slurm --constraint (node features), e.g. 'h100'.")
    exclusive: bool = F(False, "Ask for whole nodes (--exclusive).")
    requeue: bool = F(True, "Let Slurm requeue the job after preemption or node failure (--requeue).")
    signal_grace_s: int = F(120, "Seconds before the time limit at which workers get SIGUSR2 to save and requeue.")
    max_restarts: int = F(
        3,
        "Automatic restarts a run may use: after failures (a killed rank, a failed node, a collective "
        "timeout), and after interruptions (time limit, preemption) that saved no progress.",
    )
    extra: dict[str, str | int | bool] = F(
        {}, "Extra sbatch options, e.g. { reservation = 'big', 'gres-flags' = 'enforce-binding' }."
    )
    setup: list[str] = F(
        [], "Shell lines run once on the batch host before the workers start (module load, venv activation)."
    )
    container: ContainerSection = F(
        ContainerSection(), "The container the workers run in ([slurm.container]; Slurm jobs only)."
    )


@dataclass
class ModelSection:
    name_or_path: str = F(
        "",
        "Pretrained weights: a local HF model folder (config.json + *.safetensors) or a hub id (org/name), "
        "resolved on the submitting host to a snapshot in the HF cache (HF_HOME), downloaded there if missing; "
        "compute nodes never download. Any AutoModelForCausalLM family. Empty: random init (`config`, `preset`).",
    )
    revision: str = F(
        "",
        "Hub revision (branch, tag or commit) of a hub id in name_or_path or config (empty: the default branch); "
        "the run's job.toml records the commit it resolved to.",
    )
    config: str = F(
        "",
        "Random init from a config: a folder with a config.json (or a hub id), any AutoModelForCausalLM family.",
    )
    preset: str = F(
        "llama-tiny",
        "Built-in config for random init (when name_or_path and config are empty): llama-tiny, llama-small, "
        "llama-1b, qwen2-tiny, gpt-neox-tiny, "
        'mixtral-tiny; "" to build from from_config alone (it must then name a model_type).',
    )
    from_config: dict[str, Any] = F(
        {},
        "Config keys over the preset's, the config folder's or the pretrained model's, e.g. "
        '{ num_hidden_layers = 4 } or { output_router_logits = true }; with preset = "", a model_type and its '
        'keys, e.g. { model_type = "qwen2", hidden_size = 256, ... } (transformers\' defaults fill the rest). '
        "With pretrained weights, keys that change shapes fail when the weights load.",
    )
    dtype: Literal["float32", "bfloat16", "float16"] = F("float32", "dtype of the master weights.")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = F("sdpa", "HF attention kernel.")


@dataclass
class DataSection:
    source: Literal["synthetic", "files"] = F("synthetic", "'synthetic' random tokens, or 'files' to read `paths`.")
    paths: list[str] = F(
        [],
        "Training data, with source = 'files': .txt files (one document each), .jsonl records (also .jsonl.gz, "
        ".jsonl.zst), .parquet files, folders written by datasets' save_to_disk, or folders that "
        "datasets.load_dataset reads (parquet/json/csv files); globs allowed; relative to this file. "
        "Tokenized once into a prepared dataset (see cache_dir) that every rank reads without loading it.",
    )
    format: Literal["text", "chat"] = F(
        "text",
        "'text': each record is a document (`text_key`); 'chat': each record holds a conversation "
        "(`messages_key`: a list of {role, content}) rendered with the tokenizer's chat template, and the "
        "loss is computed on the assistant messages only.",
    )
    text_key: str = F("text", "Field holding the text of .jsonl, parquet and dataset records (format = 'text').")
    messages_key: str = F("messages", "Field holding the list of {role, content} messages (format = 'chat').")
    split: str = F("train", "Split to read from a dataset folder that holds several (save_to_disk or load_dataset).")
    tokenizer: str = F(
        "bytes",
        "'bytes' (built-in byte-level, no download), a local HF tokenizer folder or a hub id (resolved on the "
        "submitting host like model.name_or_path, at model.revision when it is the model's id); with a chat "
        "template for format = 'chat'.",
    )
    seq_len: int = F(128, "Tokens per sample.")
    packing: Literal["auto", "concat", "documents"] = F(
        "auto",
        "How documents become samples. 'concat': one token stream (EOS after each text document) cut into "
        "seq_len windows that cross document boundaries. 'documents': whole documents packed into samples, the "
        "rest padded (never trained on); position ids restart at each document and attention stays inside it "
        "(sdpa and eager: a block-diagonal mask; flash_attention_2: its variable-length kernel); a document "
        "longer than seq_len is cut into seq_len-token pieces, each its own context. 'auto': 'documents' for "
        "format = 'chat', else 'concat'.",
    )
    cache_dir: str = F(
        "",
        "Folder of prepared (tokenized) datasets, shared by all ranks and jobs and keyed by the content of the "
        "sources, the tokenizer and the format (empty: <run_root>/.cache/tokens). On a cluster: the shared "
        "filesystem.",
    )
    prepare_workers: int = F(
        0, "Processes that tokenize when a dataset is prepared (0: every CPU this process may use)."
    )


@dataclass
class EvalSection:
    fraction: float = F(
        0.0,
        "Fraction of the training documents held out for evaluation (chosen by job.seed, never trained on); 0: none.",
    )
    paths: list[str] = F(
        [], "Evaluation data instead of a held-out fraction: files or folders like data.paths (same format)."
    )
    every_steps: int = F(0, "Evaluate every N steps (0: only after the last step); with fraction or paths.")
    batches: int = F(
        10,
        "Micro-batches each rank evaluates (train.micro_batch_size samples each): the first batches x ranks x "
        "micro_batch_size samples of a fixed order, the same every time. eval_loss and eval_ppl go into "
        "metrics.jsonl.",
    )


@dataclass
class TrainSection:
    steps: int = F(100, "Optimizer steps in total (a resumed run continues to this number).")
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


@dataclass
class FsdpSection:
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


@dataclass
class CheckpointSection:
    dir: str = F("", "Where checkpoints go (empty: <run folder>/checkpoints).")
    every_steps: int = F(0, "Save every N steps (0: only at the end and on preemption).")
    keep_last: int = F(2, "Complete checkpoints to keep; older ones are deleted after a newer one is complete.")
    async_: bool = F(False, "Save in the background (DCP async_save) while training continues.", key="async")
    async_mode: Literal["thread", "process"] = F(
        "thread", "With async: write from a thread, or from a saver process per rank (started at the first save)."
    )
    writer_threads: int = F(4, "Threads writing each rank's checkpoint files (one file per thread).")


Tracker = Literal["tensorboard", "wandb", "mlflow"]


@dataclass
class LogSection:
    trackers: list[Tracker] = F(
        [],
        "Experiment trackers rank 0 logs to, any of 'tensorboard' (<run folder>/tensorboard/), 'wandb' "
        "(files in <run folder>/wandb/), 'mlflow'; one tracker run per clusterfsdp run, across requeues and "
        "resumes. Needs `pip install 'clusterfsdp[trackers]'` where the workers run.",
    )
    project: str = F("", "W&B project and MLflow experiment (empty: job.name). W&B's entity: $WANDB_ENTITY.")
    mlflow_tracking_uri: str = F(
        "",
        "MLflow server or store (empty: $MLFLOW_TRACKING_URI, else a file store in <run folder>/mlruns). "
        "Credentials belong in [env] MLFLOW_TRACKING_PASSWORD/TOKEN, never in this URI.",
    )


@dataclass
class JobSpec:
    job: JobSection = field(default_factory=JobSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    fsdp: FsdpSection = field(default_factory=FsdpSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)
    env: dict[str, str] = field(
        default_factory=dict,
        metadata={"doc": "Extra environment for the workers; overrides everything clusterfsdp sets (NCCL_*, etc.)."},
    )

    # ---- derived facts (used by validate, the sbatch renderer and the worker)
    @property
    def tasks_per_node(self) -> int:
        s = self.slurm
        return s.tasks_per_node or s.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.slurm.nodes * self.tasks_per_node

    @property
    def effective_sharding(self) -> str:
        """`hybrid` on one node is plain `full` sharding (nothing to replicate across)."""
        if self.fsdp.sharding == "hybrid" and self.slurm.nodes == 1:
            return "full"
        return self.fsdp.sharding

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """(replicate, shard) for hybrid, (world,) otherwise."""
        if self.effective_sharding == "hybrid":
            return (self.slurm.nodes, self.tasks_per_node)
        return (self.world_size,)

    @property
    def packing(self) -> str:
        """data.packing with 'auto' decided: 'documents' for chat data, else 'concat'."""
        if self.data.packing == "auto":
            return "documents" if self.data.format == "chat" else "concat"
        return self.data.packing

    @property
    def eval_enabled(self) -> bool:
        return self.data.source == "files" and (self.eval.fraction > 0 or bool(self.eval.paths))

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.world_size * self.train.micro_batch_size * self.train.grad_accum

    @property
    def time_minutes(self) -> int:
        return parse_time_minutes(self.slurm.time)

    def notices(self) -> list[str]:
        """Non-fatal facts the user should see before queueing."""
        out = []
        if self.fsdp.sharding == "hybrid" and self.slurm.nodes == 1:
            out.append("fsdp.sharding = 'hybrid' on 1 node: nothing to replicate across nodes, using 'full' sharding.")
        if self.slurm.gpus_per_node == 0 and self.fsdp.mixed_precision != "fp32":
            out.append(
                f"no GPUs: mixed_precision = '{self.fsdp.mixed_precision}' runs on CPU (slow); fp32 is usual there."
            )
        return out


SECTIONS: dict[str, type] = {f.name: f.type for f in dataclasses.fields(JobSpec)}  # type: ignore[misc]
_HINTS: dict[type, dict[str, Any]] = {
    cls: typing.get_type_hints(cls)
    for cls in (
        JobSection,
        SlurmSection,
        ModelSection,
        DataSection,
        TrainSection,
        EvalSection,
        FsdpSection,
        CheckpointSection,
        LogSection,
        ContainerSection,
        JobSpec,
    )
}


def toml_key(f: dataclasses.Field) -> str:
    return f.metadata.get("key") or f.name


def section_fields(section: str) -> dict[str, dataclasses.Field]:
    """TOML key -> dataclass field for one section."""
    cls = _section_class(section)
    return {toml_key(f): f for f in dataclasses.fields(cls)}


def _section_class(section: str) -> type:
    return {f.name: _HINTS[JobSpec][f.name] for f in dataclasses.fields(JobSpec) if f.name != "env"}[section]


def type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in get_args(tp))
    if origin in (types.UnionType, typing.Union):
        return " or ".join(type_name(a) for a in get_args(tp))
    if origin is list:
        return f"list of {type_name(get_args(tp)[0])}"
    if origin is dict or dataclasses.is_dataclass(tp):
        return "table"
    if tp is Any:
        return "any value"
    return {str: "string", int: "integer", float: "number", bool: "boolean"}.get(tp, str(tp))


def _describe(value: Any) -> str:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "table"}.get(
        type(value), type(value).__name__
    )
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def coerce(path: str, tp: Any, value: Any) -> Any:
    """Check `value` against the annotation `tp`; return it (ints widened to float) or raise SpecError."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise SpecError([f"{path}: expected a table, found {_describe(value)}"])
        errors: list[str] = []
        table = _table(path, tp, value, errors)
        if errors:
            raise SpecError(errors)
        return table
    if origin is Literal:
        choices = get_args(tp)
        if value in choices and type(value) is type(choices[0]):
            return value
        hint = ""
        if isinstance(value, str):
            close = difflib.get_close_matches(value, [str(c) for c in choices], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
        raise SpecError([f"{path}: expected one of {type_name(tp)}, found {_describe(value)}{hint}"])
    if origin in (types.UnionType, typing.Union):
        for option in get_args(tp):
            try:
                return coerce(path, option, value)
            except SpecError:
                pass
        raise SpecError([f"{path}: expected {type_name(tp)}, found {_describe(value)}"])
    if origin is list:
        if not isinstance(value, list):
            raise SpecError([f"{path}: expected {type_name(tp)}, found {_describe(value)}"])
        (item,) = get_args(tp)
        return [coerce(f"{path}[{i}]", item, v) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError([f"{path}: expected a table, found {_describe(value)}"])
        _, vt = get_args(tp)
        return {str(k): coerce(f"{path}.{k}", vt, v) for k, v in value.items()}
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if tp is float and type(value) is float and not math.isfinite(value):
        raise SpecError([f"{path}: expected a finite number, found {value!r}"])
    if tp is str and type(value) is str and "\x00" in value:
        raise SpecError([f"{path}: contains a NUL character"])
    if tp in (int, float, str, bool) and type(value) is tp:
        return value
    raise SpecError([f"{path}: expected {type_name(tp)}, found {_describe(value)}"])


def _unknown(path: str, key: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]}?" if close else f"; valid keys: {', '.join(valid)}"
    return f"{path}: unknown key{hint}"


def from_dict(data: dict[str, Any]) -> JobSpec:
    """Build a JobSpec from parsed TOML, collecting every error, then run cross-field checks."""
    errors: list[str] = []
    spec = JobSpec()
    for name, value in data.items():
        if name not in SECTIONS:
            errors.append(_unknown(name, name, list(SECTIONS)))
            continue
        if name == "env":
            try:
                spec.env = coerce("env", dict[str, str], value)
            except SpecError as e:
                errors += e.errors
            continue
        if not isinstance(value, dict):
            errors.append(f"{name}: expected a table [{name}], found {_describe(value)}")
            continue
        setattr(spec, name, _table(name, _section_class(name), value, errors))
    if errors:
        raise SpecError(errors)
    check(spec)
    return spec


def _table(path: str, cls: type, value: dict[str, Any], errors: list[str]) -> Any:
    """An instance of the dataclass `cls` (a section or a nested table like [slurm.container])
    from a TOML table: defaults for missing keys, one error per unknown or mistyped key."""
    fields = {toml_key(f): f for f in dataclasses.fields(cls)}
    hints = _HINTS[cls]
    table = cls()
    for key, v in value.items():
        here = f"{path}.{key}"
        if key not in fields:
            errors.append(_unknown(here, key, list(fields)))
            continue
        try:
            setattr(table, fields[key].name, coerce(here, hints[fields[key].name], v))
        except SpecError as e:
            errors += e.errors
    return table


def check(spec: JobSpec) -> None:
    """Cross-field checks that must pass before anything is queued."""
    errors: list[str] = []
    s, t, d, c = spec.slurm, spec.train, spec.data, spec.checkpoint

    def positive(path: str, value: float, minimum: float = 1) -> None:
        if value < minimum:
            errors.append(f"{path}: must be >= {minimum:g}, found {value!r}")

    positive("slurm.nodes", s.nodes)
    positive("slurm.gpus_per_node", s.gpus_per_node, 0)
    positive("slurm.tasks_per_node", s.tasks_per_node, 0)
    positive("slurm.cpus_per_task", s.cpus_per_task, 0)
    positive("slurm.mem_gb", s.mem_gb, 0)
    positive("slurm.signal_grace_s", s.signal_grace_s, 0)
    positive("slurm.max_restarts", s.max_restarts, 0)
    positive("train.steps", t.steps)
    positive("train.micro_batch_size", t.micro_batch_size)
    positive("train.grad_accum", t.grad_accum)
    positive("train.log_every", t.log_every)
    positive("train.warmup", t.warmup, 0)
    positive("train.weight_decay", t.weight_decay, 0)
    positive("train.max_grad_norm", t.max_grad_norm, 0)
    positive("data.seq_len", d.seq_len, 2)
    positive("checkpoint.every_steps", c.every_steps, 0)
    positive("checkpoint.keep_last", c.keep_last)
    positive("checkpoint.writer_threads", c.writer_threads)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", spec.job.name) or spec.job.name in (".", ".."):
        errors.append(
            f"job.name: {_short(spec.job.name)} must be 1-100 letters, digits, '.', '_' or '-', "
            "and not '.' or '..' (it names a folder)"
        )
    if 0 < s.mem_gb * 1024 < 1:
        errors.append(f"slurm.mem_gb: {s.mem_gb!r} is less than 1 MB (0 means Slurm's default)")
    if s.mem_gb > 1e6:
        errors.append(f"slurm.mem_gb: {s.mem_gb!r} GB per node is more than any node has")
    errors += _sbatch_value_errors(s)
    errors += _container_errors(s.container)
    errors += _log_errors(spec.log)
    if not 0 < t.lr < 1:
        errors.append(f"train.lr: expected a number in (0, 1), found {t.lr!r}")
    if not 0 <= t.min_lr_ratio <= 1:
        errors.append(f"train.min_lr_ratio: expected a number in [0, 1], found {t.min_lr_ratio!r}")
    try:
        minutes = parse_time_minutes(s.time)
        if minutes * 60 <= s.signal_grace_s:
            errors.append(
                f"slurm.signal_grace_s: {s.signal_grace_s} s is not shorter than the time limit ({minutes} min)"
            )
    except ValueError as e:
        errors.append(f"slurm.time: {e}")
    if s.gpus_per_node and s.tasks_per_node and s.tasks_per_node != s.gpus_per_node:
        errors.append(
            f"slurm.tasks_per_node: one worker per GPU is required, found {s.tasks_per_node} tasks for "
            f"{s.gpus_per_node} GPUs (set tasks_per_node = 0)"
        )
    if d.source == "files" and not d.paths:
        errors.append("data.paths: source = 'files' needs at least one path")
    if d.source == "synthetic" and d.paths:
        errors.append("data.paths: set data.source = 'files' to read these paths")
    errors += _model_errors(spec.model)
    if d.source == "synthetic" and d.format == "chat":
        errors.append("data.format: 'chat' needs data.source = 'files'")
    if d.format == "chat" and d.tokenizer == "bytes":
        errors.append("data.format: 'chat' needs a tokenizer with a chat template; data.tokenizer = 'bytes' has none")
    positive("data.prepare_workers", d.prepare_workers, 0)
    _check_eval(spec, errors)
    if spec.fsdp.version == 1 and spec.fsdp.compile:
        errors.append("fsdp.compile: supported with fsdp.version = 2 only")
    for key in spec.env:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            errors.append(f"env.{key}: not a valid environment variable name")
    if errors:
        raise SpecError(errors)


def _check_eval(spec: JobSpec, errors: list[str]) -> None:
    e = spec.eval
    if not 0 <= e.fraction < 1:
        errors.append(f"eval.fraction: expected a number in [0, 1), found {e.fraction!r}")
    if e.fraction and e.paths:
        errors.append("eval.paths: give eval.paths or eval.fraction, not both")
    if e.every_steps < 0:
        errors.append(f"eval.every_steps: must be >= 0, found {e.every_steps!r}")
    if e.batches < 1:
        errors.append(f"eval.batches: must be >= 1, found {e.batches!r}")
    if (e.fraction or e.paths) and spec.data.source != "files":
        errors.append("eval: held-out or separate evaluation data needs data.source = 'files'")
    if e.every_steps and not (e.fraction or e.paths):
        errors.append("eval.every_steps: set eval.fraction or eval.paths to say what to evaluate on")


# What may reach an `#SBATCH` line from job.toml. Slurm's own parser honours quotes and backslashes
# inside those lines (a quoted value can smuggle further options in), so each value is held to the
# characters its option needs: names for partition/account/qos, the feature expression syntax for
# constraint, and for `extra` values the characters of node lists, GRES, times, paths and mail
# addresses. No space, quote, backslash, '$', '#', ';' or control character ever passes.
_SBATCH_NAME = re.compile(r"[A-Za-z0-9_.,-]+")
_SBATCH_CONSTRAINT = re.compile(r"[A-Za-z0-9_.,&|*()\[\]-]+")
_SBATCH_EXTRA_KEY = re.compile(r"[a-z][a-z0-9-]*")
_SBATCH_EXTRA_VALUE = re.compile(r"[A-Za-z0-9_.,:=@%/+*&|()\[\]-]*")


def _config_override_errors(preset: dict[str, Any], overrides: dict[str, Any]) -> list[str]:
    """A key the preset sets with a number or a boolean must be overridden with the same kind
    (sizes and counts: a whole number >= 1), so a typo fails here and not on the compute nodes."""
    errors = []
    for key, value in overrides.items():
        default = preset.get(key)
        path = f"model.from_config.{key}"
        if isinstance(default, bool):
            if not isinstance(value, bool):
                errors.append(f"{path}: expected a boolean, found {_describe(value)}")
        elif isinstance(default, int):
            if type(value) is not int or value < 1:
                errors.append(f"{path}: expected a whole number >= 1, found {_describe(value)}")
        elif isinstance(default, float) and (type(value) not in (int, float) or not math.isfinite(value)):
            errors.append(f"{path}: expected a finite number, found {_describe(value)}")
    return errors


def _short(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")


def _sbatch_value_errors(s: SlurmSection) -> list[str]:
    errors = []
    for key, pattern, allowed in (
        ("partition", _SBATCH_NAME, "letters, digits, '_', '.', ',' and '-'"),
        ("account", _SBATCH_NAME, "letters, digits, '_', '.', ',' and '-'"),
        ("qos", _SBATCH_NAME, "letters, digits, '_', '.', ',' and '-'"),
        ("constraint", _SBATCH_CONSTRAINT, "feature names and & | * ( ) [ ] ,"),
    ):
        value = getattr(s, key)
        if value and not pattern.fullmatch(value):
            errors.append(f"slurm.{key}: {_short(value)} may only contain {allowed}")
    for key, value in s.extra.items():
        if not _SBATCH_EXTRA_KEY.fullmatch(key):
            errors.append(f"slurm.extra.{key}: not an sbatch option name (lowercase letters, digits, '-')")
        elif isinstance(value, str) and not _SBATCH_EXTRA_VALUE.fullmatch(value):
            errors.append(
                f"slurm.extra.{key}: {_short(value)} may only contain letters, digits and "
                "_ . , : = @ % / + * & | ( ) [ ] -"
            )
    return errors


def _model_errors(m: ModelSection) -> list[str]:
    """Which model source the [model] keys name, and whether they agree (files are checked by
    `modelsource.prepare` before queueing)."""
    from .presets import PRESETS  # pure-Python table, no torch

    given_type = m.from_config.get("model_type")
    if m.name_or_path and m.config:
        return ["model.config: random init from a config and model.name_or_path (pretrained) exclude each other"]
    if m.name_or_path or m.config:
        return []
    if not m.preset:
        if not isinstance(given_type, str) or not given_type:
            return ['model.preset: "" needs model.from_config.model_type (or model.config, or model.name_or_path)']
        return []
    if m.preset not in PRESETS:
        close = difflib.get_close_matches(m.preset, list(PRESETS), n=1)
        hint = f"did you mean {close[0]}?" if close else f"valid presets: {', '.join(PRESETS)}"
        return [f"model.preset: unknown preset {m.preset!r}; {hint}"]
    preset_type = PRESETS[m.preset]["model_type"]
    if given_type is not None and given_type != preset_type:
        return [
            f"model.from_config.model_type: {given_type!r} differs from preset {m.preset!r} ({preset_type}); "
            f'set model.preset = "" to build a {given_type} model from from_config alone'
        ]
    return _config_override_errors(PRESETS[m.preset], m.from_config)


# What may reach the srun line (or the command inside the container) from [slurm.container]. The
# values are shell-quoted there too; these keep them to what each launcher parses as one value
# (pyxis and apptainer split mount lists at ',' and ':').
_IMAGE = re.compile(r"[A-Za-z0-9._/:@#+~-]+")
MOUNT_PATH = re.compile(r"/[A-Za-z0-9._/+@%=~-]*")  # no ',' or ':' (they separate mounts and their parts)
_MOUNT = re.compile(rf"({MOUNT_PATH.pattern}):({MOUNT_PATH.pattern})(?::[a-z+]+)?")
_OPTION = re.compile(r"--[a-z][a-z0-9-]*(=[A-Za-z0-9._/:@+,=-]*)?")


def _container_errors(c: ContainerSection) -> list[str]:
    key = "slurm.container"
    if c.kind == "none":
        given = [k for k in ("image", "mounts", "workdir", "options") if getattr(c, k)]
        return [f"{key}.{k}: set {key}.kind to run in a container" for k in given]
    errors = []
    if not c.image:
        errors.append(
            f"{key}.image: kind = {c.kind!r} needs an image" + (" (the bundle folder)" if c.kind == "oci" else "")
        )
    elif not (MOUNT_PATH if c.kind == "oci" else _IMAGE).fullmatch(c.image):
        want = (
            "an absolute path of letters, digits and . _ / + @ % = ~ -"
            if c.kind == "oci"
            else ("letters, digits and . _ / : @ # + ~ -")
        )
        errors.append(f"{key}.image: {_short(c.image)} must be {want}")
    if not re.fullmatch(r"[A-Za-z0-9._/+-]+", c.python):
        errors.append(f"{key}.python: {_short(c.python)} must be a program name or path (letters, digits, . _ / + -)")
    for i, mount in enumerate(c.mounts):
        if not _MOUNT.fullmatch(mount):
            errors.append(
                f"{key}.mounts[{i}]: {_short(mount)} must be '/SRC:/DST' or '/SRC:/DST:FLAGS' (absolute "
                "paths without ',' or ':'; flags like ro)"
            )
    if c.workdir and not MOUNT_PATH.fullmatch(c.workdir):
        errors.append(f"{key}.workdir: {_short(c.workdir)} must be an absolute path of letters, digits and . _ / + -")
    for i, option in enumerate(c.options):
        if not _OPTION.fullmatch(option):
            errors.append(f"{key}.options[{i}]: {_short(option)} must be one --option or --option=value")
    if c.kind == "oci":
        errors += [
            f"{key}.{k}: not used with kind = 'oci' (the bundle's config.json sets it)"
            for k in ("mounts", "workdir", "options")
            if getattr(c, k)
        ]
    return errors


def _log_errors(log: LogSection) -> list[str]:
    errors = [f"log.trackers: {t!r} is named twice" for t in dict.fromkeys(log.trackers) if log.trackers.count(t) > 1]
    if re.search(r"://[^/@]*@", log.mlflow_tracking_uri):
        errors.append(
            "log.mlflow_tracking_uri: has credentials (user:password@); put them in [env] "
            "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, which never reach a file"
        )
    if re.search(r"\s", log.mlflow_tracking_uri):
        errors.append(f"log.mlflow_tracking_uri: {_short(log.mlflow_tracking_uri)} contains whitespace")
    return errors


_TIME = re.compile(r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$")


def parse_time_minutes(value: int | str) -> int:
    """Slurm time limit -> whole minutes (rounded up), accepting every form sbatch accepts."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"must be a positive number of minutes, found {value}")
        return value
    m = _TIME.match(value.strip())
    if not m:
        raise ValueError(f"expected minutes or 'D-HH:MM:SS' (or MM:SS, HH:MM:SS, D-HH, D-HH:MM), found {value!r}")
    d, a, b, c = (int(x) if x else None for x in m.group("d", "a", "b", "c"))
    assert a is not None  # the pattern requires it
    if d is None:  # MM | MM:SS | HH:MM:SS
        if b is None:
            secs = a * 60
        elif c is None:
            secs = a * 60 + b
        else:
            secs = a * 3600 + b * 60 + c
    else:  # D-HH | D-HH:MM | D-HH:MM:SS
        secs = d * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    if secs <= 0:
        raise ValueError(f"must be positive, found {value!r}")
    return -(-secs // 60)


# ---------------------------------------------------------------- files, text, overrides
def loads(text: str, overrides: Sequence[str] = ()) -> JobSpec:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise SpecError([f"not valid TOML: {e}"]) from None
    except RecursionError:
        raise SpecError(["not valid TOML: arrays or tables nested too deeply"]) from None
    apply_overrides(data, overrides)
    return from_dict(data)


def load(path: str | Path, overrides: Sequence[str] = ()) -> JobSpec:
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise SpecError([f"{p}: no such file"]) from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as e:
        raise SpecError([f"{p}: cannot read: {e}"]) from None
    try:
        return with_absolute_paths(loads(text, overrides), p.parent)
    except SpecError as e:
        raise SpecError([f"{p}: {line}" if not line.startswith(str(p)) else line for line in e.errors]) from None


def with_absolute_paths(spec: JobSpec, base: Path) -> JobSpec:
    """Relative paths in a job file are relative to the file's folder; make them absolute so the
    resolved job.toml in the run folder works from any directory on any node."""
    errors: list[str] = []

    def absolute(key: str, path: str) -> str:
        if not path:
            return path
        try:
            full = (base / Path(path).expanduser()).resolve()
        except (OSError, ValueError, RuntimeError) as e:  # a loop of symlinks, an unknown ~user
            errors.append(f"{key}: {_short(path)} is not a usable path ({e.__class__.__name__})")
            return path
        if len(str(full).encode()) > 4095 or any(len(part.encode()) > 255 for part in full.parts):
            errors.append(f"{key}: {_short(path)} is longer than a path may be (255 bytes a name, 4095 in all)")
        return str(full)

    def source(key: str, value: str) -> str:
        """A folder relative to the job file becomes absolute; a hub id (org/name) stays as written."""
        if not value:
            return value
        try:
            local = value.startswith((".", "/", "~")) or (base / value).exists()
        except (OSError, ValueError):  # too long for a path: not a folder here
            local = False
        return absolute(key, value) if local else value

    out = dataclasses.replace(spec)
    run_root = absolute("job.run_root", spec.job.run_root) if spec.job.run_root else str(default_run_root(base))
    out.job = dataclasses.replace(spec.job, run_root=run_root)

    def data_path(key: str, path: str) -> str:
        """Absolute, except a hub id that is not a local path (resolved at submit, not here)."""
        return path if looks_like_hub_id(path) and not (base / path).exists() else absolute(key, path)

    out.data = dataclasses.replace(
        spec.data,
        paths=[data_path(f"data.paths[{i}]", x) for i, x in enumerate(spec.data.paths)],
        tokenizer=spec.data.tokenizer
        if spec.data.tokenizer == "bytes"
        else source("data.tokenizer", spec.data.tokenizer),
        cache_dir=absolute("data.cache_dir", spec.data.cache_dir),
    )
    out.eval = dataclasses.replace(
        spec.eval, paths=[data_path(f"eval.paths[{i}]", x) for i, x in enumerate(spec.eval.paths)]
    )
    out.checkpoint = dataclasses.replace(spec.checkpoint, dir=absolute("checkpoint.dir", spec.checkpoint.dir))
    out.model = dataclasses.replace(
        spec.model,
        name_or_path=source("model.name_or_path", spec.model.name_or_path),
        config=source("model.config", spec.model.config),
    )
    if errors:
        raise SpecError(errors)
    return out


# A HuggingFace repo id 'org/name'; a local path has './', '/', '~', a glob or a data file suffix.
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_DATA_SUFFIX = re.compile(r"\.(txt|jsonl|json|gz|zst|parquet|csv|arrow)$")


def looks_like_hub_id(path: str) -> bool:
    """'org/name' shaped, and not a data file name: a hub dataset (or model) id, resolved at submit."""
    return bool(_HUB_ID.match(path)) and ".." not in path and not _DATA_SUFFIX.search(path)


def apply_overrides(data: dict[str, Any], overrides: Sequence[str]) -> None:
    """Apply `section.key=value` overrides in place; values are TOML literals, bare words are strings."""
    errors = []
    for item in overrides:
        path, sep, raw = item.partition("=")
        parts = path.strip().split(".")
        if not sep or len(parts) < 2 or not all(parts):
            errors.append(f"--set {item!r}: expected section.key=value, e.g. train.lr=3e-4")
            continue
        try:
            value = tomllib.loads(f"v = {raw}")["v"]
        except tomllib.TOMLDecodeError:
            value = raw  # a bare word, like partition=gpu
        target = data
        for part in parts[:-1]:
            target = target.setdefault(part, {})
            if not isinstance(target, dict):
                errors.append(f"--set {item!r}: {part} is not a table")
                break
        else:
            if _field_type(parts) is str and not isinstance(value, str):
                value = raw  # a str field (or an [env] value) given 123 or true means the text
            target[parts[-1]] = value
    if errors:
        raise SpecError(errors)


def _field_type(parts: list[str]) -> Any:
    """The annotation of the key at `parts` (section, key, nested key...), or None if unknown."""
    if parts[0] == "env":
        return str if len(parts) == 2 else None
    if parts[0] not in SECTIONS:
        return None
    tp: Any = _section_class(parts[0])
    for part in parts[1:]:
        if not (dataclasses.is_dataclass(tp) and isinstance(tp, type)):
            return None
        f = {toml_key(f): f for f in dataclasses.fields(tp)}.get(part)
        if f is None:
            return None
        tp = _HINTS[tp][f.name]
    return tp


def to_dict(spec: JobSpec, *, redact: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(JobSpec):
        if f.name == "env":
            out["env"] = secretenv.redacted(spec.env) if redact else dict(spec.env)
            continue
        out[f.name] = plain(getattr(spec, f.name))
    return out


def plain(value: Any) -> Any:
    """A section or nested table as TOML data (dataclasses become tables keyed by TOML key)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {toml_key(f): plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return copy.deepcopy(value)


def dumps(spec: JobSpec, *, redact: bool = False) -> str:
    return tomli_w.dumps(to_dict(spec, redact=redact))


def secret_env(spec: JobSpec) -> dict[str, str]:
    """The [env] entries that look like secrets; they travel in the process environment, never in files."""
    return secretenv.values(spec.env)


def describe_schema(selector: str = "") -> list[str]:
    """Lines documenting every key (or those under `selector`, e.g. 'slurm' or 'train.lr')."""
    lines = []
    for f in dataclasses.fields(JobSpec):
        if selector and f.name != selector.split(".")[0]:
            continue
        if f.name == "env":
            lines.append(f"[env]  table of strings\n    {f.metadata['doc']}")
            continue
        lines.append(f"[{f.name}]")
        lines += _describe_table(_section_class(f.name), "", selector.split(".", 1)[1] if "." in selector else "")
    return lines


def key_paths() -> list[str]:
    """Every key as it is written with --set: `section.key`, nested tables' as `slurm.container.kind`."""

    def walk(cls: type, prefix: str) -> list[str]:
        out = []
        for f in dataclasses.fields(cls):
            tp = _HINTS[cls][f.name]
            if dataclasses.is_dataclass(tp) and isinstance(tp, type):
                out += walk(tp, f"{prefix}{toml_key(f)}.")
            else:
                out.append(prefix + toml_key(f))
        return out

    return [k for name in SECTIONS if name != "env" for k in walk(_section_class(name), f"{name}.")]


def _describe_table(cls: type, prefix: str, selector: str) -> list[str]:
    """Schema lines of one table's keys (nested tables' keys as `table.key`) under `selector`."""
    lines = []
    for sf in dataclasses.fields(cls):
        key = prefix + toml_key(sf)
        if selector and not (key == selector or key.startswith(selector + ".") or selector.startswith(key + ".")):
            continue
        tp = _HINTS[cls][sf.name]
        if dataclasses.is_dataclass(tp) and isinstance(tp, type):
            if not selector or selector == key or key.startswith(selector + "."):
                lines.append(f"  {key}    (table)\n      {sf.metadata['doc']}")
            lines += _describe_table(tp, key + ".", selector)
            continue
        lines.append(
            f"  {key} = {_inline(plain(getattr(cls(), sf.name)))}    ({type_name(tp)})\n      {sf.metadata['doc']}"
        )
    return lines


def starter_toml(spec: JobSpec | None = None) -> str:
    """A commented job.toml with every key, its default and its docstring."""
    spec = spec or JobSpec()
    data = to_dict(spec)
    out = [
        "# clusterfsdp job spec. Every key is optional; values shown are the defaults.",
        "# `clusterfsdp schema` documents each key; `clusterfsdp validate` checks the file.",
        "",
    ]
    for f in dataclasses.fields(JobSpec):
        out.append(f"[{f.name}]")
        if f.name == "env":
            out.append(f"# {f.metadata['doc']}")
            out += [f"{_inline_key(k)} = {_inline(v)}" for k, v in spec.env.items()] or ['# NCCL_DEBUG = "WARN"']
            out.append("")
            continue
        for key, sf in section_fields(f.name).items():
            out.append(f"# {sf.metadata['doc']}")
            out.append(f"{key} = {_inline(data[f.name][key])}")
        out.append("")
    return "\n".join(out)


def _inline(value: Any) -> str:
    """One TOML value on one line (tables inline), for the commented starter file."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_inline_key(k)} = {_inline(v)}" for k, v in value.items()) + " }" if value else "{}"
    return tomli_w.dumps({"v": value}).strip()[4:]


def _inline_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else tomli_w.dumps({"v": key}).strip()[4:]
