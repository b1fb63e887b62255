"""The job spec's schema: one typed dataclass per `[section]` of job.toml, and the facts derived
from it (world size, mesh shape, time limit in minutes).

Each field carries its docstring in `metadata["doc"]` (`F`); `clusterfsdp schema`, the starter
file of `clusterfsdp init` and the TUI's compose form are generated from it (`docs.py`), so the
documentation cannot drift from the code. Also here: the lookups the codec, the checks and the
docs share (TOML key of a field, annotation of a section's field, the names of types and values
in error lines). Pure Python: no torch.

Over 500 lines on purpose: every section's dataclass stays in this one module because its fields
are made with `F`, and ruff's RUF009 (no function calls in dataclass defaults) accepts `F` as a
field specifier only in the module that defines it; a split would scatter per-line exemptions.
"""

# No `from __future__ import annotations` here: the codec resolves these annotations on every
# load (`hints`), and strings would be compiled one by one each time (start-up, issue 25 item 3).

import copy
import dataclasses
import functools
import re
import types
import typing
from dataclasses import field
from typing import Any, Literal, get_args, get_origin

from ..errors import UserError
from ..value import value
from .benchsection import BenchmarksSection
from .nodes import NodeRange, grad_accum_at
from .nodes import parse as parse_nodes

# Upper bounds of counts that start processes or threads on one host: more is a typo, and would
# exhaust the node (or the login node, for prepare) before anything useful happens.
MAX_TASKS_PER_NODE = 256  # slurm.tasks_per_node, slurm.gpus_per_node
MAX_WRITER_THREADS = 64  # checkpoint.writer_threads
MAX_PREPARE_WORKERS = 512  # data.prepare_workers

# [env] variables that decide which code the workers (and their subprocesses) load, or which
# startup files a shell reads. Another user's job file, or a planted run folder resumed by its
# victim, could run anything through them; a job that means it names them in job.allow_env.
LOADER_ENV = (
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PATH",
    "BASH_ENV",
    "ENV",
    "PYTHONWARNINGS",  # a warning category is imported by name: PYTHONWARNINGS=error::mod.Cls imports mod
    "PYTHONPYCACHEPREFIX",  # where the interpreter takes compiled .pyc files from
    "TORCHINDUCTOR_CACHE_DIR",  # compiled kernels (shared libraries, Python) loaded from there
    "TRITON_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",  # C++/CUDA extensions built and loaded from there
    "NCCL_NET_PLUGIN",  # shared libraries NCCL dlopens
    "NCCL_TUNER_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "GCONV_PATH",  # glibc's iconv modules, dlopened
)


class SpecError(UserError, ValueError):
    """A job spec that cannot be used. `errors` holds one line per problem."""

    def __init__(self, errors: list[str]):
        self.errors = errors
        super().__init__("\n".join(errors))


def F(default: Any, doc: str, *, key: str | None = None) -> Any:
    """A schema field with its docstring (and TOML key when it is not a valid Python name)."""
    meta = {"doc": doc, "key": key}
    if isinstance(default, (list, dict)) or dataclasses.is_dataclass(default):
        return field(default_factory=lambda d=default: copy.deepcopy(d), metadata=meta)
    return field(default=default, metadata=meta)


@value
class JobSection:
    """[job]: the run's name, where its folder goes, its seed."""

    name: str = F("job", "Job name; runs go to <run_root>/<name>/<run id>/ and it names the Slurm job.")
    run_root: str = F(
        "",
        "Folder that holds run folders (relative to this file); on a cluster it must be on the shared filesystem. "
        "Empty: $CLUSTERFSDP_RUN_ROOT, else run_root in ~/.config/clusterfsdp/config.toml, else ./runs beside "
        "this file (the same default `runs`, `status` and the TUI use).",
    )
    seed: int = F(0, "Seed for model init, data order and dropout; same seed + same world size = same losses.")
    allow_env: list[str] = F(
        [],
        f"[env] variables that change which code the workers load, set on purpose: any of {', '.join(LOADER_ENV)}. "
        "They are refused in [env] unless named here, so a job file (or a run folder) from someone else cannot "
        "slip them in unnoticed.",
    )


@value
class ContainerSection:
    """[slurm.container]: the image the workers run in (pyxis, Apptainer, OCI)."""

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


@value
class SlurmSection:
    """[slurm]: what each attempt asks of Slurm, and how it comes back after an interruption."""

    partition: str = F("", "Slurm partition (empty: the cluster's default).")
    account: str = F("", "Slurm account to charge (empty: your default).")
    qos: str = F("", "Slurm QOS (empty: default).")
    nodes: int | str = F(
        1,
        "Number of nodes, or a range 'MIN-MAX' (an elastic start: the job starts on as many as are free, keeps the "
        "global batch through train.grad_accum, which is the accumulation at MAX, and grows when more are free, "
        "up to slurm.max_grows times; docs/recovery.md, 'Elastic starts').",
    )
    gpus_per_node: int = F(
        0, f"GPUs per node; one worker process per GPU. 0 for CPU-only jobs (at most {MAX_TASKS_PER_NODE})."
    )
    tasks_per_node: int = F(
        0, f"Worker processes per node; 0 means one per GPU (or 1 without GPUs); at most {MAX_TASKS_PER_NODE}."
    )
    cpus_per_task: int = F(0, "CPUs per worker process (0: Slurm's default).")
    mem_gb: float = F(0.0, "Memory per node in GB (0: Slurm's default).")
    time: int | str = F(
        60, "Time limit: minutes (int) or Slurm's forms 'MM', 'HH:MM:SS', 'D-HH', 'D-HH:MM', 'D-HH:MM:SS'."
    )
    time_min: int | str = F(
        0,
        "Least time limit the job accepts (--time-min): Slurm's backfill may start it sooner with a time limit "
        "between this and slurm.time; the workers save and requeue before whichever limit it got. Forms as for "
        "slurm.time; 0: none.",
    )
    max_grows: int = F(
        2,
        "With a node range: how many times a run may checkpoint and requeue itself to grow onto nodes that came "
        "free (rank 0 asks sinfo every slurm.grow_check_s); 0: start on what is free, never grow.",
    )
    grow_check_s: int = F(
        60, "With a node range below its largest size: seconds between rank 0's checks for free nodes (sinfo)."
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
    preflight: bool = F(
        True,
        "Before step 1 of every attempt each node checks its GPUs, the free space where checkpoints go and in "
        "/dev/shm, its network path to the master, and a short all-reduce (nodes/<job>.<restart>/<host>.json); "
        "a node that fails is left out of the next attempt, which uses a restart (docs/recovery.md).",
    )
    max_gpu_hours: float = F(
        0.0,
        "Budget of the run in GPU-hours, as Slurm accounts them (AllocTRES gres/gpu x elapsed, every attempt and "
        "requeue): an attempt whose own plan (nodes x gpus_per_node x time) would pass what is left is refused "
        "before queueing, and the workers save a checkpoint and stop once it is used. 0: no budget.",
    )
    quarantine_hours: float = F(
        24.0,
        "Hours a node stays excluded from later submits (of every user sharing the run root's node record) after "
        "a run found it faulty: failed pre-flight, named by a hang, lost mid-run. 0: never exclude recorded nodes. "
        "`clusterfsdp nodes` lists them, `nodes clear NODE` ends a quarantine.",
    )
    preflight_free_gb: float = F(
        1.0, "Pre-flight: least free GiB where checkpoints go (the newest checkpoint's size when that is larger)."
    )
    preflight_shm_gb: float = F(
        0.05,
        "Pre-flight: least free GiB in /dev/shm (with checkpoint.async_mode = 'process', this node's share of the "
        "newest checkpoint when that is larger: the saver's staging buffers live there).",
    )
    extra: dict[str, str | int | bool] = F(
        {},
        "Extra sbatch options, e.g. { reservation = 'big', 'gres-flags' = 'enforce-binding' }. Options "
        "clusterfsdp manages (time, nodes, ntasks*, signal, export, array, requeue, output, error, job-name, "
        "hold, dependency, ...) and their abbreviations are refused: set the [slurm] key instead; many "
        "points of a sweep are not one job array. `comment` and `exclude` are merged with clusterfsdp's own.",
    )
    setup: list[str] = F(
        [],
        "Shell lines run once on the batch host before the workers start (module load, venv activation). "
        "Each entry is one line; #SBATCH lines, here-documents (<<), trailing backslashes and lines bash "
        "cannot parse together (unbalanced quotes, an if without fi) are refused.",
    )
    container: ContainerSection = F(
        ContainerSection(), "The container the workers run in ([slurm.container]; Slurm jobs only)."
    )


@value
class ModelSection:
    """[model]: which model (a folder, a hub id, a config or a preset) and its dtype."""

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
    dtype: Literal["float32", "bfloat16", "float16"] = F(
        "float32",
        "dtype of the master weights: every weight of a full fine-tune; with [peft], the adapters and "
        "modules_to_save (with their gradients and AdamW moments) and the frozen base unless peft.base_dtype says "
        "otherwise.",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = F("sdpa", "HF attention kernel.")


@value
class DataSource:
    """One `[[data.sources]]` entry: a dataset of a mixture, with its weight and field mapping."""

    path: str = F(
        "",
        "A file, folder or glob like an entry of data.paths (relative to this file), read as its own prepared dataset.",
    )
    weight: float = F(
        1.0,
        "Its share of the training samples (weights are normalized over the sources; a sample is seq_len "
        "positions of one source, so this is also its share of the tokens trained on).",
    )
    format: Literal["", "text", "chat", "preference", "unpaired"] = F(
        "",
        "'text', 'chat', 'preference' or 'unpaired' (empty: data.format; preference and unpaired sources cannot "
        "mix with others).",
    )
    split: str = F("", "Split of a dataset folder (empty: data.split).")
    text_key: str = F("", "Field holding the text (format = 'text'; empty: data.text_key).")
    messages_key: str = F(
        "", "Field holding the conversation (format = 'chat'; empty: data.messages_key), e.g. 'conversations'."
    )
    prompt_key: str = F("", "format = 'preference': the field holding the prompt (empty: data.prompt_key).")
    chosen_key: str = F("", "format = 'preference': the field holding the preferred answer (empty: data.chosen_key).")
    rejected_key: str = F(
        "", "format = 'preference': the field holding the dispreferred answer (empty: data.rejected_key)."
    )
    completion_key: str = F("", "format = 'unpaired': the field holding the completion (empty: data.completion_key).")
    label_key: str = F(
        "", "format = 'unpaired': the field holding the true/false desirability label (empty: data.label_key)."
    )
    role_key: str = F("role", "Field of each message holding its role, e.g. 'from' (ShareGPT).")
    content_key: str = F("content", "Field of each message holding its text, e.g. 'value' (ShareGPT).")
    roles: dict[str, str] = F(
        {},
        "Role values of the source and the chat role each becomes, e.g. { human = 'user', gpt = 'assistant' }; "
        "values not named are kept.",
    )
    prompt: str = F(
        "",
        "Instead of a field: a template of the record's columns, {name} each (e.g. '{instruction}\\n\\n{input}', "
        "Alpaca), rendered and stripped: the user message (format 'chat') or the start of the text ('text').",
    )
    response: str = F(
        "", "With prompt: the template of the answer (e.g. '{output}'): the assistant message, or the rest of the text."
    )
    system: str = F("", "With prompt, format 'chat': the template of a system message (none when it renders empty).")


@value
class DataSection:
    """[data]: the training data, its format, tokenizer, packing and prepared cache."""

    source: Literal["synthetic", "files"] = F("synthetic", "'synthetic' random tokens, or 'files' to read `paths`.")
    paths: list[str] = F(
        [],
        "Training data, with source = 'files': .txt files (one document each), .jsonl records (also .jsonl.gz, "
        ".jsonl.zst), .parquet files, folders written by datasets' save_to_disk, or folders that "
        "datasets.load_dataset reads (parquet/json/csv files); globs allowed; relative to this file. "
        "Tokenized once into a prepared dataset (see cache_dir) that every rank reads without loading it.",
    )
    format: Literal["text", "chat", "preference", "unpaired"] = F(
        "text",
        "'text': each record is a document (`text_key`); 'chat': each record holds a conversation "
        "(`messages_key`: a list of {role, content}) rendered with the tokenizer's chat template, and the "
        "loss is computed on the assistant messages only; 'preference': each record is a pair for preference "
        "training (train.objective): a prompt (`prompt_key`) and a preferred and a dispreferred answer "
        "(`chosen_key`, `rejected_key`), each a string (joined as text) or a list of {role, content} messages "
        "(rendered with the chat template); the loss is on the answers' tokens only; 'unpaired': each record "
        "is one example for train.objective = 'kto': a prompt (`prompt_key`), a completion (`completion_key`, a "
        "string or messages like a pair's answer) and a `label_key` true (desirable) or false (undesirable).",
    )
    text_key: str = F("text", "Field holding the text of .jsonl, parquet and dataset records (format = 'text').")
    messages_key: str = F("messages", "Field holding the list of {role, content} messages (format = 'chat').")
    prompt_key: str = F(
        "prompt",
        "format = 'preference': the field holding the prompt (a string or messages); '' when the answers hold "
        "the whole conversation (the messages they begin with alike are the prompt: Anthropic-HH style).",
    )
    chosen_key: str = F("chosen", "format = 'preference': the field holding the preferred answer.")
    rejected_key: str = F("rejected", "format = 'preference': the field holding the dispreferred answer.")
    completion_key: str = F("completion", "format = 'unpaired': the field holding the completion.")
    label_key: str = F(
        "label", "format = 'unpaired': the field holding the label, true (desirable) or false (undesirable)."
    )
    split: str = F("train", "Split to read from a dataset folder that holds several (save_to_disk or load_dataset).")
    sources: list[DataSource] = F(
        [],
        "Instead of paths: several datasets mixed by weight, each a [[data.sources]] table (path, weight, format, "
        "split and a field mapping; docs/data.md). Samples are drawn from them in a seeded, resumable order; an "
        "epoch is as many samples as the sources hold together.",
    )
    tokenizer: str = F(
        "auto",
        "'auto': the tokenizer of model.name_or_path when that folder (or hub snapshot) has one "
        "(tokenizer.json, tokenizer_config.json, ...), else 'bytes'; the run's job.toml records the choice. "
        "'bytes': the built-in byte-level tokenizer (no download). Or a local HF tokenizer folder (write a "
        "folder named auto or bytes as ./auto) or a hub id (resolved on the submitting host like "
        "model.name_or_path, at model.revision when it is the model's id); with a chat template for "
        "format = 'chat'.",
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
    overlong: Literal["split", "truncate", "drop"] = F(
        "split",
        "A document longer than seq_len, packing = 'documents' (not 'concat'): 'split' into seq_len pieces, each "
        "its own context; 'truncate' to its start (a conversation: the whole leading turns that fit, never an "
        "answer without its prompt; none fits: dropped); 'drop'. Applied to the sample index, not the tokens. "
        "Preference pairs keep a long answer's start ('split', 'truncate') or drop the pair ('drop'; also when "
        "an answer would keep no token).",
    )
    cache_dir: str = F(
        "",
        "Folder of prepared (tokenized) datasets, shared by all ranks and jobs and keyed by the content of the "
        "sources, the tokenizer and the format (empty: <run_root>/.cache/tokens). On a cluster: the shared "
        "filesystem.",
    )
    bad_records: str = F(
        "error",
        "A record prepare cannot read (bad JSON, a missing or mistyped key, not UTF-8, a conversation the chat "
        "template refuses): 'error' stops at the first (file:line named); 'skip' leaves them out, counted in the "
        "prepared dataset's manifest (shown by `data prepare`, `validate`); 'skip:N' / 'skip:P%' fail beyond N "
        "records / P percent of them. Skipping is a prepared dataset of its own. .txt files always fail.",
    )
    prepare_workers: int = F(
        0,
        "Processes that tokenize when a dataset is prepared (0: every CPU this process may use; at most "
        f"{MAX_PREPARE_WORKERS}).",
    )
    prepare: Literal["job", "in_job", "require"] = F(
        "job",
        "Where data that is not prepared yet gets tokenized, when the job is submitted to Slurm: 'job' a Slurm "
        "job array of its own (one task per node of the job, on prepare_partition), queued first, the training "
        "job waiting for it (--dependency=afterok); 'in_job' rank 0 of the training job, while the other GPUs "
        "wait; 'require' refuse to submit (prepare it with `clusterfsdp data prepare`). The local executor "
        "always prepares in the job.",
    )
    prepare_partition: str = F(
        "", "Slurm partition of the prepare job array (data.prepare = 'job'; empty: the job's slurm.partition)."
    )


@value
class EvalSection:
    """[eval]: the held-out set and how often it is evaluated."""

    fraction: float = F(
        0.0,
        "Fraction of the training documents held out for evaluation (chosen by job.seed, never trained on); 0: none.",
    )
    paths: list[str] = F(
        [], "Evaluation data instead of a held-out fraction: files or folders like data.paths (same format)."
    )
    split: str = F("", "Split of the dataset folders in eval.paths (e.g. 'test' of a DatasetDict); empty: data.split.")
    every_steps: int = F(0, "Evaluate every N steps (0: only after the last step); with fraction or paths.")
    batches: int = F(
        10,
        "Micro-batches each rank evaluates (train.micro_batch_size samples each): the first batches x ranks x "
        "micro_batch_size samples of a fixed order, the same every time. eval_loss and eval_ppl go into "
        "metrics.jsonl.",
    )
    samples: int = F(
        0,
        "Prompts generated greedily at every evaluation (0: off), written to <run>/samples/step-N.jsonl, the "
        "trackers and the TUI's run screen: the first lines of eval.samples_file, else the first samples of the "
        "eval set (a conversation up to its first answer, a text's first tokens). All ranks run the sharded "
        "model (one layer gathered at a time), so any model size that trains can generate.",
    )
    samples_file: str = F(
        "",
        'Prompts for eval.samples instead of the eval set: .txt (one prompt a line) or .jsonl ({"prompt": ...} '
        "a line); with data.format = 'chat' each is a user message rendered with the chat template.",
    )
    samples_max_new_tokens: int = F(64, "Tokens generated at most per prompt (generation stops at a special token).")


@value
class EarlyStopping:
    """[train.early_stopping]: stop when the eval loss stops improving."""

    metric: Literal["", "eval_loss"] = F("", "'eval_loss' ends the run when it stops improving; '': off.")
    patience: int = F(3, "Evaluations in a row without an improvement of min_delta that end the run.")
    min_delta: float = F(0.0, "How much lower than the best so far an eval_loss must be to count as an improvement.")


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
        "Stop when the eval metric stops improving (needs [eval]): the run saves and ends COMPLETED, with the "
        "reason in its completed event and `status`.",
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
class CheckpointSection:
    """[checkpoint]: how often and where the sharded checkpoints are written, and how many kept."""

    dir: str = F("", "Where checkpoints go (empty: <run folder>/checkpoints).")
    every_steps: int = F(0, "Save every N steps (0: only at the end and on preemption).")
    keep_last: int = F(2, "Complete checkpoints to keep; older ones are deleted after a newer one is complete.")
    keep_best: Literal["", "eval_loss", "eval_reward_accuracy"] = F(
        "",
        "'eval_loss': also save at every evaluation that beats the lowest eval loss so far, and keep that checkpoint "
        "(never pruned by keep_last; `export --best`); 'eval_reward_accuracy' (preference training): the same for "
        "the highest reward accuracy on the held-out pairs; '': off.",
    )
    async_: bool = F(False, "Save in the background (DCP async_save) while training continues.", key="async")
    async_mode: Literal["thread", "process"] = F(
        "thread", "With async: write from a thread, or from a saver process per rank (started at the first save)."
    )
    writer_threads: int = F(
        4, f"Threads writing each rank's checkpoint files (one file per thread), 1 to {MAX_WRITER_THREADS}."
    )


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


Tracker = Literal["tensorboard", "wandb", "mlflow"]


@value
class LogSection:
    """[log]: experiment trackers rank 0 logs to."""

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


# Points of one sweep at most: Slurm's default MaxArraySize (1001) holds array indices 0-1000,
# and every point is a run folder made before anything is queued.
MAX_SWEEP_POINTS = 1000


@value
class SweepSection:
    """[sweep]: read by `clusterfsdp sweep` (control.sweep), never part of a run's JobSpec: each
    point is a normal run whose job.toml has the point's values in place."""

    grid: dict[str, list[Any]] = F(
        {},
        "Keys to vary, each with its list of values ('train.lr' = [1e-4, 3e-4]); every combination is a point "
        "(the cross product with zip). Values are typed by the schema as --set types them.",
    )
    zip: dict[str, list[Any]] = F(
        {},
        "Keys varied together: lists of one length, the i-th values of all of them make one point.",
    )
    max_parallel: int = F(
        0,
        "Points running at once (Slurm: the job array's %N throttle; local: processes at once); 0: Slurm all, "
        f"local 1. At most {MAX_SWEEP_POINTS} points per sweep.",
    )


@value
class JobSpec:
    """A whole job.toml, typed: one field per section, and the facts derived from them."""

    job: JobSection = field(default_factory=JobSection)
    slurm: SlurmSection = field(default_factory=SlurmSection)
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalSection = field(default_factory=EvalSection)
    fsdp: FsdpSection = field(default_factory=FsdpSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    log: LogSection = field(default_factory=LogSection)
    peft: PeftSection = field(default_factory=PeftSection)
    benchmarks: BenchmarksSection = field(default_factory=BenchmarksSection)
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
    def node_range(self) -> NodeRange:
        """slurm.nodes parsed: a count is a range of one size (ValueError for a spec that was not checked).
        `high` is the size the global batch is defined at, `low` what node exclusions must leave."""
        return parse_nodes(self.slurm.nodes)

    @property
    def world_size(self) -> int:
        """Ranks at the largest size (an elastic attempt's are its own: `on_nodes`)."""
        return self.node_range.high * self.tasks_per_node

    @property
    def effective_sharding(self) -> str:
        """`hybrid` on one node is plain `full` sharding (nothing to replicate across)."""
        if self.fsdp.sharding == "hybrid" and self.node_range.high == 1:
            return "full"
        return self.fsdp.sharding

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        """(replicate, shard) for hybrid, (world,) otherwise."""
        if self.effective_sharding == "hybrid":
            return (self.node_range.high, self.tasks_per_node)
        return (self.world_size,)

    def grad_accum_at(self, nodes: int) -> int | None:
        """train.grad_accum on `nodes` nodes with the same global batch (None: no whole number)."""
        return grad_accum_at(self.node_range, self.train.grad_accum, nodes)

    def on_nodes(self, nodes: int) -> "JobSpec":
        """This spec as an attempt on `nodes` nodes of its range runs it: slurm.nodes = `nodes`
        and the grad_accum that keeps the global batch (ValueError outside the range, or where
        no whole grad_accum does: validate refuses such ranges)."""
        accum = self.grad_accum_at(nodes)
        if nodes not in self.node_range.sizes or accum is None:
            raise ValueError(
                f"the allocation has {nodes} node(s), which slurm.nodes = {self.slurm.nodes!r} does not allow with "
                f"the global batch {self.global_batch}"
            )
        return dataclasses.replace(
            self,
            slurm=dataclasses.replace(self.slurm, nodes=nodes),
            train=dataclasses.replace(self.train, grad_accum=accum),
        )

    @property
    def base_dtype(self) -> str:
        """The dtype of the weights that do not train: peft.base_dtype for a LoRA job that sets it,
        else model.dtype (every weight of a full fine-tune)."""
        return (self.peft.method == "lora" and self.peft.base_dtype) or self.model.dtype

    @property
    def packing(self) -> str:
        """data.packing with 'auto' decided: 'documents' for chat data (any chat source), else 'concat'."""
        if self.data.format in TWO_ROWS or any(s.format in TWO_ROWS for s in self.data.sources):
            return "pairs"  # one sample is one pair (its answers) or one unpaired example (+ its KL row) in two rows
        if self.data.packing == "auto":
            chat = self.data.format == "chat" or any(s.format == "chat" for s in self.data.sources)
            return "documents" if chat else "concat"
        return self.data.packing

    @property
    def preference_training(self) -> bool:
        """A preference objective (train.objective other than 'sft'): pairs in, rewards out."""
        return self.train.objective != "sft"

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
        out = []  # (not 'hybrid' on 1 node: the default on one node, validate's mesh line says 'full')
        if self.slurm.gpus_per_node == 0 and self.fsdp.mixed_precision != "fp32":
            out.append(
                f"no GPUs: mixed_precision = '{self.fsdp.mixed_precision}' runs on CPU (slow); fp32 is usual there."
            )
        if self.slurm.gpus_per_node == 0 and self.fsdp.cpu_offload and self.fsdp.version == 1:
            out.append("no GPUs: FSDP1 keeps its parameters in host memory anyway; fsdp.cpu_offload changes nothing.")
        return out


SECTIONS: dict[str, type] = {f.name: f.type for f in dataclasses.fields(JobSpec)}  # type: ignore[misc]


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a schema dataclass, per field name; resolved when first asked
    (the codec asks only for the sections a job file has): start-up is paid on every call."""
    return typing.get_type_hints(cls)


def toml_key(f: dataclasses.Field) -> str:
    """The key a field is written with in job.toml (`async_` is `async`)."""
    return f.metadata.get("key") or f.name


def section_fields(section: str) -> dict[str, dataclasses.Field]:
    """TOML key -> dataclass field for one section."""
    cls = section_class(section)
    return {toml_key(f): f for f in dataclasses.fields(cls)}


def section_class(section: str) -> type:
    """The dataclass of one section (`slurm` -> SlurmSection); [env] is a plain table and has none."""
    return {f.name: hints(JobSpec)[f.name] for f in dataclasses.fields(JobSpec) if f.name != "env"}[section]


def type_name(tp: Any) -> str:
    """An annotation as the docs and error lines name it ('integer', "'a' | 'b'", 'list of string')."""
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


def closest(word: str, choices: list[str]) -> str | None:
    """The choice closest to a mistyped word, if any is close (difflib is imported here, not at
    start-up: only an error line needs it)."""
    import difflib

    close = difflib.get_close_matches(word, choices, n=1)
    return close[0] if close else None


def describe_value(value: Any) -> str:
    """A value as error lines name it: its TOML kind and its repr, cut at 40 characters."""
    kind = {bool: "boolean", int: "integer", float: "number", str: "string", list: "list", dict: "table"}.get(
        type(value), type(value).__name__
    )
    text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def short(value: str) -> str:
    """A string as error lines quote it, cut at 40 characters (values may be long or hostile)."""
    return repr(value if len(value) <= 40 else value[:37] + "...")


_TIME = r"^(?:(?P<d>\d+)-)?(?P<a>\d+)(?::(?P<b>\d+))?(?::(?P<c>\d+))?$"


def parse_time_minutes(value: int | str) -> int:
    """Slurm time limit -> whole minutes (rounded up), accepting every form sbatch accepts."""
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"must be a positive number of minutes, found {value}")
        return value
    m = re.match(_TIME, value.strip())
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
