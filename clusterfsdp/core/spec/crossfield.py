"""Cross-field checks of a JobSpec: what each key alone cannot say (ranges, keys that need or
exclude each other, the model source the [model] keys name). Collected into one SpecError, so a
user sees every problem at once. Values that reach a shell or `#SBATCH` line are held to the
allowlists of `allowlists.py`.
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..presets import PRESETS
from . import badrecords, benchmetric, benchsection
from . import objective as objectivechecks
from . import peft as peftchecks
from .allowlists import container_errors, env_errors, sbatch_name_error, sbatch_value_errors, setup_errors
from .nodes import parse as parse_nodes
from .nodes import refusal as node_range_refusal
from .schema import (
    MAX_PREPARE_WORKERS,
    MAX_TASKS_PER_NODE,
    MAX_WRITER_THREADS,
    JobSpec,
    LogSection,
    ModelSection,
    SlurmSection,
    SpecError,
    closest,
    describe_value,
    parse_time_minutes,
    short,
)
from .templates import template_fields
from .tokenizer import chat_problem


def check(spec: JobSpec) -> None:
    """Cross-field checks that must pass before anything is queued."""
    errors: list[str] = []
    s, t, d, c = spec.slurm, spec.train, spec.data, spec.checkpoint

    def positive(path: str, value: float, minimum: float = 1, maximum: float | None = None) -> None:
        if value < minimum:
            errors.append(f"{path}: must be >= {minimum:g}, found {value!r}")
        elif maximum is not None and value > maximum:
            errors.append(f"{path}: must be <= {maximum:g}, found {value!r}")

    nodes_problems = _nodes_errors(spec)
    errors += nodes_problems
    positive("slurm.gpus_per_node", s.gpus_per_node, 0, MAX_TASKS_PER_NODE)
    positive("slurm.tasks_per_node", s.tasks_per_node, 0, MAX_TASKS_PER_NODE)
    positive("slurm.cpus_per_task", s.cpus_per_task, 0)
    positive("slurm.mem_gb", s.mem_gb, 0)
    positive("slurm.signal_grace_s", s.signal_grace_s, 0)
    positive("slurm.max_restarts", s.max_restarts, 0)
    positive("slurm.preflight_free_gb", s.preflight_free_gb, 0)
    positive("slurm.preflight_shm_gb", s.preflight_shm_gb, 0)
    positive("slurm.quarantine_hours", s.quarantine_hours, 0, 24 * 365)
    positive("slurm.max_gpu_hours", s.max_gpu_hours, 0)
    positive("slurm.max_grows", s.max_grows, 0)
    positive("slurm.grow_check_s", s.grow_check_s, 5, 7 * 24 * 3600)
    over = None if nodes_problems else budget_refusal(spec)
    if over:
        errors.append(over)
    if t.epochs > 0:
        if not math.isfinite(t.epochs) or t.epochs > 1e6:
            errors.append(f"train.epochs: expected a number of passes up to 1e6, found {t.epochs!r}")
        if d.source != "files":
            errors.append(f"train.epochs: needs data from files (data.source = {d.source!r} has no epochs)")
    else:
        positive("train.steps", t.steps)
        positive("train.epochs", t.epochs, 0)
    positive("train.micro_batch_size", t.micro_batch_size)
    positive("train.grad_accum", t.grad_accum)
    positive("train.log_every", t.log_every)
    positive("train.warmup", t.warmup, 0)
    positive("train.weight_decay", t.weight_decay, 0)
    positive("train.max_grad_norm", t.max_grad_norm, 0)
    positive("data.seq_len", d.seq_len, 2)
    positive("checkpoint.every_steps", c.every_steps, 0)
    positive("checkpoint.keep_last", c.keep_last)
    positive("checkpoint.writer_threads", c.writer_threads, 1, MAX_WRITER_THREADS)
    w = t.watchdog  # the shortest timeout must leave room for a few heartbeats (2 s each)
    for key in ("hang_min_s", "startup_s", "data_prep_s", "model_load_s", "eval_s", "save_s"):
        positive(f"train.watchdog.{key}", getattr(w, key), 10, 7 * 24 * 3600)
    positive("train.watchdog.hang_factor", w.hang_factor, 2)
    positive("train.watchdog.straggler_factor", w.straggler_factor, 0)
    positive("train.watchdog.straggler_checks", w.straggler_checks, 1)
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,100}", spec.job.name) or spec.job.name in (".", ".."):
        errors.append(
            f"job.name: {short(spec.job.name)} must be 1-100 letters, digits, '.', '_' or '-', "
            "and not '.' or '..' (it names a folder)"
        )
    if 0 < s.mem_gb * 1024 < 1:
        errors.append(f"slurm.mem_gb: {s.mem_gb!r} is less than 1 MB (0 means Slurm's default)")
    if s.mem_gb > 1e6:
        errors.append(f"slurm.mem_gb: {s.mem_gb!r} GB per node is more than any node has")
    errors += sbatch_value_errors(s)
    errors += setup_errors(s.setup)
    errors += container_errors(s.container)
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
        errors += _time_min_errors(s, minutes)
    except ValueError as e:
        errors.append(f"slurm.time: {e}")
    if s.gpus_per_node and s.tasks_per_node and s.tasks_per_node != s.gpus_per_node:
        errors.append(
            f"slurm.tasks_per_node: one worker per GPU is required, found {s.tasks_per_node} tasks for "
            f"{s.gpus_per_node} GPUs (set tasks_per_node = 0)"
        )
    if d.source == "files" and not d.paths and not d.sources:
        errors.append("data.paths: source = 'files' needs at least one path")
    if d.source == "synthetic" and (d.paths or d.sources):
        errors.append(f"data.{'paths' if d.paths else 'sources'}: set data.source = 'files' to read these paths")
    errors += _sources_errors(spec)
    errors += _model_errors(spec.model)
    if d.source == "synthetic" and d.format == "chat":
        errors.append("data.format: 'chat' needs data.source = 'files'")
    if problem := chat_problem(spec):
        errors.append(problem)

    positive("data.prepare_workers", d.prepare_workers, 0, MAX_PREPARE_WORKERS)
    if problem := sbatch_name_error("data.prepare_partition", d.prepare_partition):
        errors.append(problem)
    if badrecords.parse(d.bad_records) is None:
        errors.append(f"data.bad_records: must be {badrecords.SYNTAX}, found {d.bad_records!r}")
    _check_eval(spec, errors)
    _check_guard(spec, errors)
    if spec.fsdp.version == 1 and spec.fsdp.compile:
        errors.append("fsdp.compile: supported with fsdp.version = 2 only")
    errors += peftchecks.errors(spec)
    errors += benchmark_errors(spec.benchmarks) + benchmetric.errors(spec)
    errors += objectivechecks.errors(spec)
    errors += env_errors(spec.env, spec.job.allow_env)
    if errors:
        raise SpecError(errors)


def budget_refusal(spec: JobSpec, used_gpu_hours: float = 0.0) -> str | None:
    """Why an attempt of `spec` may not be queued under slurm.max_gpu_hours with `used_gpu_hours`
    already spent (None: it may): its own plan, every GPU of its nodes for its whole time limit,
    must fit what is left (control/cost.py accounts the use)."""
    budget = spec.slurm.max_gpu_hours
    if budget <= 0:
        return None
    s, minutes, nodes = spec.slurm, spec.time_minutes, spec.node_range.high
    plan, left = nodes * s.gpus_per_node * minutes / 60.0, budget - used_gpu_hours
    if plan <= left:
        return None
    return (
        f"slurm.max_gpu_hours = {budget:g}: an attempt may use {plan:.2f} GPU-h ({nodes} node(s) x "
        f"{s.gpus_per_node} GPU(s) x {minutes} min) and {left:.2f} are left ({used_gpu_hours:.2f} used); "
        "lower slurm.time or slurm.nodes, or raise slurm.max_gpu_hours"
    )


def _nodes_errors(spec: JobSpec) -> list[str]:
    """slurm.nodes: a count, or a range whose every size keeps the global batch (nodes.refusal)."""
    s = spec.slurm
    try:
        nodes = parse_nodes(s.nodes)
    except ValueError as e:
        return [f"slurm.nodes: {e}"]
    if not nodes.elastic or spec.train.grad_accum < 1:
        return []
    why = node_range_refusal(s.nodes, nodes, spec.train.grad_accum, spec.tasks_per_node * spec.train.micro_batch_size)
    return [why] if why else []


def _time_min_errors(s: SlurmSection, minutes: int) -> list[str]:
    """slurm.time_min: 0 (none) or a time limit no longer than slurm.time that leaves the workers
    more than slurm.signal_grace_s to save in."""
    if s.time_min in (0, ""):
        return []
    try:
        least = parse_time_minutes(s.time_min)
    except ValueError as e:
        return [f"slurm.time_min: {e}"]
    if least > minutes:
        return [f"slurm.time_min: {least} min is longer than slurm.time ({minutes} min); lower it or raise slurm.time"]
    if least * 60 <= s.signal_grace_s:
        return [f"slurm.time_min: {least} min leaves no time before the save signal (slurm.signal_grace_s = "
                f"{s.signal_grace_s} s); raise it"]  # fmt: skip
    return []


def sweep_budget_refusal(specs: list[JobSpec]) -> str | None:
    """Why a sweep of these points may not be queued under slurm.max_gpu_hours, which bounds the
    sweep as a whole (None: it may): every point's plan (nodes x GPUs x time limit, as
    `budget_refusal` counts one attempt) together must fit it. Its points share the key (a
    sweep cannot vary it: `sweepplan.fixed_reason`)."""
    budget = specs[0].slurm.max_gpu_hours if specs else 0.0
    if budget <= 0:
        return None
    plans = [s.node_range.high * s.slurm.gpus_per_node * s.time_minutes / 60.0 for s in specs]  # (a range: its largest)
    if sum(plans) <= budget:
        return None
    s, nodes, minutes = specs[0].slurm, specs[0].node_range.high, specs[0].time_minutes
    each = (f"{plans[0]:.2f} GPU-h each: {nodes} node(s) x {s.gpus_per_node} GPU(s) x {minutes} min"
            if len(set(plans)) == 1 else f"{min(plans):.2f} to {max(plans):.2f} GPU-h each")  # fmt: skip
    return (
        f"slurm.max_gpu_hours = {budget:g} bounds the whole sweep: its {len(specs)} points may use "
        f"{sum(plans):.2f} GPU-h ({each}); lower slurm.time or slurm.nodes, sweep fewer points, or raise "
        "slurm.max_gpu_hours"
    )


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
    stop = spec.train.early_stopping
    if stop.patience < 1:
        errors.append(f"train.early_stopping.patience: must be >= 1, found {stop.patience!r}")
    if stop.min_delta < 0:
        errors.append(f"train.early_stopping.min_delta: must be >= 0, found {stop.min_delta!r}")
    for key, on in (("train.early_stopping.metric", stop.metric), ("checkpoint.keep_best", spec.checkpoint.keep_best)):
        if on in benchmetric.EVAL_KEEP_BEST[1:] and not spec.eval_enabled:
            errors.append(f"{key}: {on!r} needs an eval set ([eval] fraction or paths)")
    if (e.fraction or e.paths) and spec.data.source != "files":
        errors.append("eval: held-out or separate evaluation data needs data.source = 'files'")
    if e.every_steps and not (e.fraction or e.paths):
        errors.append("eval.every_steps: set eval.fraction or eval.paths to say what to evaluate on")
    _check_eval_samples(spec, errors)


def _check_eval_samples(spec: JobSpec, errors: list[str]) -> None:
    e = spec.eval
    if e.samples < 0:
        errors.append(f"eval.samples: must be >= 0, found {e.samples!r}")
    if e.samples_max_new_tokens < 1:
        errors.append(f"eval.samples_max_new_tokens: must be >= 1, found {e.samples_max_new_tokens!r}")
    if e.samples and not spec.eval_enabled:
        errors.append("eval.samples: generating at each evaluation needs an eval set ([eval] fraction or paths)")
    if e.samples_file and not e.samples:
        errors.append("eval.samples_file: set eval.samples to the number of its prompts to generate from")
    if e.samples_file and not e.samples_file.endswith((".txt", ".jsonl")):
        errors.append(f"eval.samples_file: expected a .txt or .jsonl file, found {e.samples_file!r}")


def _check_guard(spec: JobSpec, errors: list[str]) -> None:
    g = spec.train.guard
    for key, factor in (("spike_loss", g.spike_loss), ("spike_grad_norm", g.spike_grad_norm)):
        if factor and not factor > 1:
            errors.append(f"train.guard.{key}: must be 0 (off) or > 1, found {factor!r}")
    if g.spike_window < 1:
        errors.append(f"train.guard.spike_window: must be >= 1, found {g.spike_window!r}")
    if g.rollback_after < 0:
        errors.append(f"train.guard.rollback_after: must be >= 0, found {g.rollback_after!r}")


def _config_override_errors(preset: dict[str, Any], overrides: dict[str, Any]) -> list[str]:
    """A key the preset sets with a number or a boolean must be overridden with the same kind
    (sizes and counts: a whole number >= 1), so a typo fails here and not on the compute nodes."""
    errors = []
    for key, value in overrides.items():
        default = preset.get(key)
        path = f"model.from_config.{key}"
        if isinstance(default, bool):
            if not isinstance(value, bool):
                errors.append(f"{path}: expected a boolean, found {describe_value(value)}")
        elif isinstance(default, int):
            if type(value) is not int or value < 1:
                errors.append(f"{path}: expected a whole number >= 1, found {describe_value(value)}")
        elif isinstance(default, float) and (type(value) not in (int, float) or not math.isfinite(value)):
            errors.append(f"{path}: expected a finite number, found {describe_value(value)}")
    return errors


# A hub revision as huggingface_hub stores it under refs/ in the cache: a git ref name (`main`,
# `v1.0`, `refs/pr/1`) or a commit; never a path that climbs out of the cache.
_REVISION = r"[A-Za-z0-9_][A-Za-z0-9._-]*(/[A-Za-z0-9_][A-Za-z0-9._-]*)*"


def _model_errors(m: ModelSection) -> list[str]:
    """Which model source the [model] keys name, and whether they agree (files are checked by
    `modelsource.prepare` before queueing)."""
    if m.revision and (not re.fullmatch(_REVISION, m.revision) or ".." in m.revision):
        return [
            f"model.revision: {short(m.revision)} is not a branch, tag or commit (letters, digits, . _ - and "
            "inner '/', no '..'): it names a file in the HF cache"
        ]
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
        close = closest(m.preset, list(PRESETS))
        hint = f"did you mean {close}?" if close else f"valid presets: {', '.join(PRESETS)}"
        return [f"model.preset: unknown preset {m.preset!r}; {hint}"]
    preset_type = PRESETS[m.preset]["model_type"]
    if given_type is not None and given_type != preset_type:
        return [
            f"model.from_config.model_type: {given_type!r} differs from preset {m.preset!r} ({preset_type}); "
            f'set model.preset = "" to build a {given_type} model from from_config alone'
        ]
    return _config_override_errors(PRESETS[m.preset], m.from_config)


def _log_errors(log: LogSection) -> list[str]:
    errors = [f"log.trackers: {t!r} is named twice" for t in dict.fromkeys(log.trackers) if log.trackers.count(t) > 1]
    if re.search(r"://[^/@]*@", log.mlflow_tracking_uri):
        errors.append(
            "log.mlflow_tracking_uri: has credentials (user:password@); put them in [env] "
            "MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD, which never reach a file"
        )
    if re.search(r"\s", log.mlflow_tracking_uri):
        errors.append(f"log.mlflow_tracking_uri: {short(log.mlflow_tracking_uri)} contains whitespace")
    return errors


def _sources_errors(spec: JobSpec) -> list[str]:
    """[[data.sources]]: instead of data.paths, each with a path, a positive weight and templates
    of plain column names."""
    d = spec.data
    if not d.sources:
        return []
    errors = []
    if d.paths:
        errors.append("data.sources: give data.paths or [[data.sources]], not both")
    for i, s in enumerate(d.sources):
        key = f"data.sources[{i}]"
        if not s.path:
            errors.append(f"{key}.path: each source needs a path")
        if not (math.isfinite(s.weight) and s.weight > 0):
            errors.append(f"{key}.weight: must be a number > 0, found {s.weight!r}")
        for name in ("prompt", "response", "system"):
            try:
                template_fields(getattr(s, name))
            except ValueError as e:
                errors.append(f"{key}.{name}: not a template of column names ({e}); write {{column}}, {{{{ for a brace")
        if s.system and not s.prompt and not s.response:
            errors.append(f"{key}.system: a system template goes with prompt and response templates")
        if (s.prompt or s.system) and not s.response and (s.format or d.format) == "chat":
            errors.append(f"{key}.response: a conversation needs the template of its answer (e.g. '{{output}}')")
    return errors


def benchmark_errors(b: benchsection.BenchmarksSection) -> list[str]:
    """[benchmarks]' values alone (ranges, names that reach #SBATCH); files: `benchfiles`."""
    if not b.tasks:
        return []
    out = []
    for i, task in enumerate(b.tasks):
        if not task.strip() or (any(c.isspace() or c == "," for c in task) and not benchsection.is_local(task)):
            out.append(f"benchmarks.tasks[{i}]: {short(task)} is neither a task name nor a .yaml file")
    if len(set(b.tasks)) != len(b.tasks):
        out.append("benchmarks.tasks: a task is named twice")
    for key, found, low, high in (
        ("every_checkpoints", b.every_checkpoints, 0, None),
        ("limit", b.limit, 0, None),
        ("num_fewshot", b.num_fewshot, -1, 1000),
        ("batch_size", b.batch_size, 1, 4096),
        ("gpus", b.gpus, 0, benchsection.MAX_BENCH_GPUS),
    ):
        if found < low or (high is not None and found > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            out.append(f"benchmarks.{key}: must be {bound}, found {found!r}")
    if problem := sbatch_name_error("benchmarks.partition", b.partition):
        out.append(problem)
    try:
        parse_time_minutes(b.time)
    except ValueError as e:
        out.append(f"benchmarks.time: {e}")
    return out
