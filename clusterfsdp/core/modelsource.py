"""Where a job's model and tokenizer come from, checked before anything is queued.

`prepare(spec)` is what `submit`, `validate` and the TUI call: it resolves hub ids to local
snapshot folders (`hub.py`), checks that a weights folder has `config.json` and weights (every
shard an index names, each safetensors header readable and its file long enough), that a config
folder has `config.json`, and that a tokenizer folder has tokenizer files. Every problem is one
`SpecError` line naming the key. `keep(prepared, folder)` then copies the small files that
`export` and `resume` need (configs, tokenizer files, never weights) into the run folder, so the
run outlives the original folders.

It also counts parameters without torch: exactly from the safetensors headers of a weights
folder, or estimated from a config for random init (`param_estimate`, one formula for decoder-only
transformers; see its docstring for what it covers).

Pure Python: config.json and safetensors headers are read as JSON, never through transformers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import struct
from dataclasses import field
from pathlib import Path
from typing import Any

from . import fileio, hub
from . import spec as specmod
from .fileio import atomic_write
from .presets import PRESETS
from .spec.peft import trainable_params
from .value import value

WEIGHTS_INDEX = "model.safetensors.index.json"
BIN_INDEX = "pytorch_model.bin.index.json"
# What a hub download of a model fetches: configs, safetensors weights, tokenizer files
# (not .bin/.pth/.gguf/onnx duplicates of the same weights).
MODEL_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
TOKENIZER_PATTERNS = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
# Tokenizer files kept with the run (config.json too: AutoTokenizer reads model_type from it when
# tokenizer_config.json names no tokenizer class).
TOKENIZER_KEEP = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
    "config.json",
)
MODEL_KEEP = ("config.json", "generation_config.json")
SOURCES_FILE = "sources.json"


@value(frozen=True)
class ResolvedSource:
    """Where one key of the job points after resolution (written to <run>/model/sources.json)."""

    key: str  # "model.name_or_path", "model.config" or "data.tokenizer"
    given: str  # as written in the job file
    path: str  # the local folder it resolved to
    repo_id: str = ""  # set when `given` was a hub id
    revision: str = ""  # the commit of that snapshot


@value
class Prepared:
    """A job whose model and tokenizer sources are local folders that passed their checks."""

    spec: specmod.JobSpec
    notes: list[str] = field(default_factory=list)
    sources: list[ResolvedSource] = field(default_factory=list)


@value(frozen=True)
class ParamEstimate:
    """The model's parameter count, for the memory estimate and MFU."""

    total: int
    active: int  # per token: for a mixture of experts, only the experts a token is routed to
    layers: int
    exact: bool  # counted from the weights' headers, or by a formula known exact for the family
    model_type: str


# ---------------------------------------------------------------- prepare / keep
def prepare(spec: specmod.JobSpec, mode: hub.Mode = "download") -> Prepared:
    """Resolve hub ids and check the model and tokenizer sources; raise SpecError with every problem.

    mode: 'download' (submit: fetch missing hub snapshots), 'check' (validate: ask the hub about
    uncached ids, download nothing), 'cache' (TUI: local cache only)."""
    errors: list[str] = []
    out = Prepared(spec)
    m, d = spec.model, spec.data
    base_type = None
    if m.name_or_path:
        path = _locate(out, errors, "model.name_or_path", m.name_or_path, m.revision, mode, MODEL_PATTERNS)
        if path:
            config = _config(errors, "model.name_or_path", Path(path))
            errors += weight_problems("model.name_or_path", Path(path), out.notes)
            base_type = config.get("model_type") if config else None
            out.spec = _replace(out.spec, "model", name_or_path=path)
    elif m.config:
        path = _locate(out, errors, "model.config", m.config, m.revision, mode, ["*.json"])
        if path:
            config = _config(errors, "model.config", Path(path))
            base_type = config.get("model_type") if config else None
            out.spec = _replace(out.spec, "model", config=path)
    _reference_model(out, errors, mode)
    given_type = m.from_config.get("model_type")
    if base_type and given_type and given_type != base_type:
        errors.append(
            f"model.from_config.model_type: {given_type!r} differs from the config's {base_type!r} "
            "(model_type cannot be overridden; remove it)"
        )
    if d.tokenizer == "auto":
        _default_tokenizer(out, errors)
    elif d.tokenizer != "bytes":
        revision = m.revision if d.tokenizer in (m.name_or_path, m.config) else ""
        path = _locate(out, errors, "data.tokenizer", d.tokenizer, revision, mode, TOKENIZER_PATTERNS)
        if path:
            errors += tokenizer_problems("data.tokenizer", Path(path))
            out.spec = _replace(out.spec, "data", tokenizer=path)
    if not errors and out.spec.data.tokenizer == "bytes" and d.source == "files":
        _note_bytes_for_pretrained(out)
    data_paths = [_dataset(out, errors, f"data.paths[{i}]", x, mode) for i, x in enumerate(d.paths)]
    eval_paths = [_dataset(out, errors, f"eval.paths[{i}]", x, mode) for i, x in enumerate(spec.eval.paths)]
    mixed = [
        dataclasses.replace(s, path=_dataset(out, errors, f"data.sources[{i}].path", s.path, mode))
        for i, s in enumerate(d.sources)
    ]
    out.spec = _replace(out.spec, "data", paths=data_paths, sources=mixed)
    out.spec = _replace(out.spec, "eval", paths=eval_paths)
    revisions = {s.revision for s in out.sources if s.key.startswith("model.") and s.revision}
    if revisions:
        out.spec = _replace(out.spec, "model", revision=revisions.pop())
    if errors:
        raise specmod.SpecError(errors)
    return out


def _reference_model(out: Prepared, errors: list[str], mode: hub.Mode) -> None:
    """train.preference.reference_model, resolved and checked like model.name_or_path (a hub id
    to its local snapshot, a folder with config.json and weights). A clusterfsdp checkpoint
    (DCP shards, no config.json) is named as such: its HuggingFace export is what loads."""
    key, value = "train.preference.reference_model", out.spec.train.preference.reference_model
    if not value:
        return
    path = _locate(out, errors, key, value, "", mode, MODEL_PATTERNS)
    if not path:
        return
    from . import ckptfolder  # a preference job's reference model only: `validate` of the others stays light

    if (Path(path) / ckptfolder.COMPLETE).is_file() or (Path(path) / ckptfolder.DCP_METADATA).is_file():
        errors.append(
            f"{key}: {path} is a clusterfsdp checkpoint (DCP shards); export it first (`clusterfsdp export RUN "
            "--step N --to DIR`) and set reference_model to that folder"
        )
        return
    if _config(errors, key, Path(path)) is not None:
        errors += weight_problems(key, Path(path), out.notes)
    preference = dataclasses.replace(out.spec.train.preference, reference_model=path)
    out.spec = _replace(out.spec, "train", preference=preference)


def _note_bytes_for_pretrained(out: Prepared) -> None:
    """The byte tokenizer with pretrained weights (said, not refused: fine-tuning on new ids is a choice)."""
    model = Path(out.spec.model.name_or_path)
    if out.spec.model.name_or_path and model.is_dir():
        out.notes.append(
            "data.tokenizer = 'bytes' with pretrained weights: "
            + (
                "the model's own tokenizer is not used ('auto' uses it)"
                if specmod.has_tokenizer(model)
                else f"{model} has no tokenizer files, so the model trains on ids it never saw (set data.tokenizer)"
            )
        )


def _default_tokenizer(out: Prepared, errors: list[str]) -> None:
    """data.tokenizer = 'auto' once the model is a local folder (a hub id resolved above): the
    model's tokenizer when it has one, recorded in sources.json with the model's provenance."""
    out.spec = spec = specmod.default_tokenizer(out.spec)
    if problem := specmod.chat_problem(spec):
        errors.append(problem)
    if spec.data.tokenizer == "auto":  # validate or the TUI, with the model's hub id not in the cache
        out.notes.append(
            f"data.tokenizer: 'auto' is decided when submit fetches {spec.model.name_or_path} (its tokenizer if it "
            "has one); the data checks here assume 'bytes'"
        )
        out.spec = _replace(spec, "data", tokenizer="bytes")
    elif spec.data.tokenizer == spec.model.name_or_path:
        model = next(s for s in out.sources if s.key == "model.name_or_path")
        out.sources.append(dataclasses.replace(model, key="data.tokenizer", given="auto"))


def _dataset(out: Prepared, errors: list[str], key: str, value: str, mode: hub.Mode) -> str:
    """A data path as given, or the local snapshot folder of a hub dataset id (org/name) that is
    not a local path (with_absolute_paths left it as written). Only submit ('download') asks the
    hub; `validate` and the TUI look in the cache and otherwise leave the id for data.checks
    to report with the other data problems."""
    if value.startswith(("/", ".", "~")) or not specmod.looks_like_hub_id(value):
        return value
    try:
        snap = hub.resolve(value, "dataset", mode="download" if mode == "download" else "cache")
    except hub.HubError as e:
        if mode == "download":
            errors.append(f"{key}: {value!r} is not a local path and as a hub dataset id: {e}")
        return value
    if snap.path is None:
        return value
    out.sources.append(ResolvedSource(key, value, snap.path, value, snap.revision))
    return snap.path


def keep(prepared: Prepared, folder: Path) -> list[Path]:
    """Copy what export and resume need from the source folders into `folder` (<run>/model/):
    config.json and generation_config.json of the model (or config) folder, the tokenizer's
    files under tokenizer/, and sources.json. Small files only, never weights."""
    spec = prepared.spec
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    source = spec.model.name_or_path or spec.model.config
    if source:
        written += _copy(Path(source), folder, MODEL_KEEP)
    if spec.data.tokenizer != "bytes":
        written += _copy(Path(spec.data.tokenizer), folder / "tokenizer", TOKENIZER_KEEP)
    record = [dataclasses.asdict(s) for s in prepared.sources]
    atomic_write(folder / SOURCES_FILE, json.dumps(record, indent=2) + "\n")
    return [*written, folder / SOURCES_FILE]


def _copy(src: Path, dst: Path, names: tuple[str, ...]) -> list[Path]:
    dst.mkdir(parents=True, exist_ok=True)
    out = []
    for name in names:
        if (src / name).is_file():
            shutil.copyfile(src / name, dst / name)  # follows the HF cache's symlinks to the blobs
            out.append(dst / name)
    return out


def _replace(spec: specmod.JobSpec, section: str, **changes: Any) -> specmod.JobSpec:
    return dataclasses.replace(spec, **{section: dataclasses.replace(getattr(spec, section), **changes)})


def _locate(
    out: Prepared,
    errors: list[str],
    key: str,
    value: str,
    revision: str,
    mode: hub.Mode,
    patterns: list[str],
) -> str | None:
    """The local folder `value` names (a folder, or a hub id resolved through the cache), or None
    with an error or note recorded."""
    try:
        path = Path(value).expanduser()
        local = path.is_absolute() or value.startswith((".", "~")) or path.exists()
        folder = local and path.is_dir()
    except (OSError, RuntimeError, ValueError) as e:  # too long for a path, an unknown ~user
        errors.append(f"{key}: {value[:60]!r}: not a usable path ({type(e).__name__})")
        return None
    if local:
        if not folder:
            errors.append(f"{key}: {value!r}: no such folder")
            return None
        out.sources.append(ResolvedSource(key, value, str(path.resolve())))
        return str(path.resolve())
    if not hub.looks_like_repo_id(value):
        errors.append(f"{key}: {value!r} is neither a local folder nor a hub id (org/name)")
        return None
    try:
        snap = hub.resolve(value, "model", revision, mode=mode, allow_patterns=patterns)
    except hub.HubError as e:
        errors.append(f"{key}: {value!r} is not a local folder (relative to the job file) and as a hub id: {e}")
        return None
    if snap.path is None:
        out.notes.append(f"{key}: {snap.note}")
        return None
    out.sources.append(ResolvedSource(key, value, snap.path, snap.repo_id, snap.revision))
    return snap.path


# ---------------------------------------------------------------- folder checks
MAX_CONFIG_BYTES = 64 << 20  # config.json and weight indexes are KB to a few MB; more is not a model folder
SAFETENSORS_MAX_HEADER = 100_000_000  # safetensors' own limit (MAX_HEADER_SIZE in its Rust crate)


def read_config(folder: Path) -> dict[str, Any]:
    """config.json as a dict; raises ValueError with a one-line reason."""
    path = folder / "config.json"
    if not path.exists():  # (one that exists but is a FIFO or a folder is named as such below)
        raise ValueError(f"{folder} has no config.json")
    try:
        config = fileio.load_json(path, MAX_CONFIG_BYTES)  # regular files only: a shared HF cache may hold a FIFO
    except OSError as e:
        raise ValueError(f"{path}: cannot read ({e.strerror or e})") from None
    except ValueError as e:
        raise ValueError(f"{path}: not readable JSON ({e})") from None
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise ValueError(f"{path}: has no model_type (not a transformers config)")
    return config


def _config(errors: list[str], key: str, folder: Path) -> dict[str, Any] | None:
    try:
        return read_config(folder)
    except ValueError as e:
        errors.append(f"{key}: {e}")
        return None


def weight_files(folder: Path) -> list[Path]:
    """The safetensors files of a weights folder (those its index names, else every *.safetensors),
    or its torch .bin files; [] when there are none."""
    for index in (WEIGHTS_INDEX, BIN_INDEX):
        if (folder / index).exists():
            names = fileio.load_json(folder / index, MAX_CONFIG_BYTES).get("weight_map", {}).values()
            return [folder / n for n in sorted(set(names))]
    return sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))


def weight_problems(key: str, folder: Path, notes: list[str]) -> list[str]:
    """Missing or unreadable weights of a weights folder, one line each."""
    try:
        files = weight_files(folder)
    except OSError as e:
        return [f"{key}: {folder}: unreadable weights index ({e.strerror or e})"]
    except (ValueError, AttributeError) as e:
        return [f"{key}: {folder}: unreadable weights index ({e})"]
    if not files:
        return [f"{key}: {folder} has no weights (*.safetensors or pytorch_model*.bin)"]
    missing = [f.name for f in files if not f.exists()]  # (a FIFO or folder in its place: named below)
    if missing:
        return [
            f"{key}: {folder} lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''} (named by its index)"
        ]
    if files[0].suffix == ".bin":
        notes.append(
            f"{key}: torch .bin weights: every rank reads whole files; convert to safetensors to read shard by shard"
        )
        return []
    problems = []
    for f in files:
        try:
            safetensors_header(f)
        except ValueError as e:
            problems.append(f"{key}: {e}")
    return problems


def tokenizer_problems(key: str, folder: Path) -> list[str]:
    if specmod.has_tokenizer(folder):
        return []
    return [f"{key}: {folder} has no tokenizer files ({', '.join(specmod.TOKENIZER_MARKERS)})"]


def safetensors_header(path: Path) -> dict[str, Any]:
    """The JSON header of a safetensors file (names, dtypes, shapes, offsets); checks that the file
    is long enough for the data the header describes (a truncated download fails here)."""
    try:
        with fileio.open_regular(path) as f:  # (a FIFO planted in a shared HF cache would block validate)
            (size,) = struct.unpack("<Q", f.read(8))
            if size > SAFETENSORS_MAX_HEADER:
                raise OverflowError(f"a header of {size} bytes")
            header = fileio.loads(f.read(size))
        length = path.stat().st_size
    except (OSError, struct.error, ValueError, MemoryError, OverflowError) as e:
        raise ValueError(f"{path}: not a safetensors file ({type(e).__name__})") from None
    end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
    if 8 + size + end > length:
        raise ValueError(f"{path}: truncated ({length} bytes, its header describes {8 + size + end})")
    return header


# ---------------------------------------------------------------- parameter counts
def weight_shapes(folder: Path) -> dict[str, list[int]]:
    """The shape of every tensor in the folder's safetensors files, by name."""
    return {
        name: list(t["shape"])
        for f in weight_files(folder)
        for name, t in safetensors_header(f).items()
        if name != "__metadata__"
    }


def weights_param_count(folder: Path) -> int:
    """Elements of every tensor in the folder's safetensors files (tied weights are stored once)."""
    return sum(math.prod(shape) for shape in weight_shapes(folder).values())


def lora_params(spec: specmod.JobSpec) -> tuple[int, bool] | None:
    """The parameters a LoRA job trains and whether the count is exact, from the base's tensor
    shapes (spec/peft.py, as peft adds the adapters); None for a full fine-tune or a base whose
    safetensors are not on this host."""
    cfg = model_config(spec) if spec.peft.method == "lora" else None
    folder = _local_folder(spec.model.name_or_path, spec.model.revision) if cfg is not None else None
    if cfg is None or folder is None:
        return None
    try:
        shapes = weight_shapes(folder)
    except (OSError, ValueError, KeyError, AttributeError):
        return None
    return trainable_params(spec, cfg, shapes) if shapes else None


def _first(cfg: dict[str, Any], *keys: str, default: Any = None) -> Any:
    return next((cfg[k] for k in keys if cfg.get(k) is not None), default)


# Families whose MLP has two matrices (up, down) instead of the gated three (gate, up, down), with
# biases on every linear layer and LayerNorms; families with learned absolute position embeddings;
# families with biases on q, k and v only.
_TWO_MATRIX_MLP = {"gpt2", "gpt_neox", "gpt_bigcode", "opt", "phi", "starcoder2", "falcon", "bloom", "gptj", "gpt_neo"}
_LEARNED_POSITIONS = {"gpt2", "gpt_bigcode", "opt", "gpt_neo"}
_QKV_BIAS = {"qwen2", "qwen2_moe"}
# Families the formula counts exactly (checked against transformers in tests/test_modelsource.py).
EXACT_FAMILIES = {
    "llama",
    "mistral",
    "mixtral",
    "gemma",
    "phi3",
    "qwen2",
    "qwen2_moe",
    "gpt2",
    "gpt_neox",
    "gpt_bigcode",
    "starcoder2",
}


def param_estimate(cfg: dict[str, Any]) -> ParamEstimate:
    """Parameters of a decoder-only transformer from its config keys, without torch.

    Counted: token embedding (+ learned positions), per layer attention (q, k, v, o with grouped
    KV heads, their biases where the family has them) and MLP (gated three-matrix or two-matrix
    by family; for a mixture of experts every expert, the router and shared experts), norms, the
    lm_head unless tied. Exact for EXACT_FAMILIES; other families may have extras it does not know
    (q/k norms, sliding-window variants), within about 1% at tiny sizes and less at real ones.
    `active` counts only `num_experts_per_tok` of the routed experts (what a token computes)."""
    model_type = str(cfg.get("model_type", ""))
    h = int(_first(cfg, "hidden_size", "n_embd", "d_model"))
    layers = int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers"))
    heads = int(_first(cfg, "num_attention_heads", "n_head"))
    kv = 1 if cfg.get("multi_query") else int(_first(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_first(cfg, "head_dim", default=h // heads))
    vocab = int(cfg["vocab_size"])
    inter = int(_first(cfg, "intermediate_size", "n_inner", "ffn_dim", default=4 * h))
    biased = model_type in _TWO_MATRIX_MLP
    mats = 2 if biased else 3
    q, k = heads * head_dim, kv * head_dim
    attn = 2 * h * q + 2 * h * k
    if biased or cfg.get("attention_bias"):
        attn += q + 2 * k + h
    elif model_type in _QKV_BIAS:
        attn += q + 2 * k
    experts = int(_first(cfg, "num_local_experts", "num_experts", "n_routed_experts", default=0))
    if experts:
        expert = mats * h * int(_first(cfg, "moe_intermediate_size", default=inter))
        top_k = int(_first(cfg, "num_experts_per_tok", "moe_topk", default=experts))
        shared_inter = int(_first(cfg, "shared_expert_intermediate_size", default=0))
        shared = mats * h * shared_inter + (h if shared_inter else 0)  # + its sigmoid gate
        mlp, mlp_active = experts * expert + h * experts + shared, top_k * expert + h * experts + shared
    else:
        mlp = mlp_active = mats * h * inter + ((inter + h) if biased else 0)
    norm = 2 * h if biased else h  # LayerNorm has a bias, RMSNorm not
    positions = int(_first(cfg, "n_positions", "max_position_embeddings", default=0))
    embed = vocab * h + (positions * h if model_type in _LEARNED_POSITIONS else 0)
    head = 0 if cfg.get("tie_word_embeddings", model_type in _LEARNED_POSITIONS) else vocab * h
    fixed = embed + head + norm
    total = fixed + layers * (attn + mlp + 2 * norm)
    active = fixed + layers * (attn + mlp_active + 2 * norm)
    return ParamEstimate(total, active, layers, model_type in EXACT_FAMILIES, model_type)


def model_config(spec: specmod.JobSpec) -> dict[str, Any] | None:
    """The model's config keys (from_config applied), or None when they are not on this host yet
    (an uncached hub id) or not readable."""
    m = spec.model
    folder = _local_folder(m.name_or_path or m.config, m.revision)
    if m.name_or_path or m.config:
        if folder is None:
            return None
        try:
            return {**read_config(folder), **m.from_config}
        except ValueError:
            return None
    if m.preset:
        return {**PRESETS[m.preset], **m.from_config}
    return dict(m.from_config) if "model_type" in m.from_config else None


def estimate(spec: specmod.JobSpec) -> ParamEstimate | None:
    """Parameter count of the job's model: exact from a weights folder's headers, else from the config."""
    cfg = model_config(spec)
    if cfg is None:
        return None
    try:
        est = param_estimate(cfg)
    except (KeyError, TypeError, ValueError, ZeroDivisionError):
        est = None
    folder = _local_folder(spec.model.name_or_path, spec.model.revision)
    if folder is None:
        return est
    try:
        total = weights_param_count(folder)
    except (OSError, ValueError, KeyError, AttributeError):
        return est
    idle = est.total - est.active if est else 0  # experts a token is not routed to
    layers = est.layers if est else int(_first(cfg, "num_hidden_layers", "n_layer", "num_layers", default=0))
    return ParamEstimate(total, total - idle, layers, True, str(cfg.get("model_type", "")))


def _local_folder(value: str, revision: str) -> Path | None:
    """A folder path as is; a hub id through the local cache only; None when neither."""
    if not value:
        return None
    path = Path(value).expanduser()
    if path.is_dir():
        return path
    if not hub.looks_like_repo_id(value):
        return None
    try:
        snap = hub.resolve(value, "model", revision, mode="cache")
    except hub.HubError:
        return None
    return Path(snap.path) if snap.path else None


def describe(spec: specmod.JobSpec) -> str:
    """One line for `validate`'s summary: where the model comes from and its size."""
    m = spec.model
    est = estimate(spec)
    size = ""
    if est is not None:
        moe = f" ({est.active / 1e6:,.1f}M active per token)" if est.active != est.total else ""
        size = f", {est.model_type}, {'' if est.exact else '~'}{est.total / 1e6:,.1f}M params{moe}"
    if m.name_or_path:
        return f"{m.name_or_path} (pretrained{f' @ {m.revision[:12]}' if m.revision else ''}){size}"
    if m.config:
        return f"{m.config} (random init from its config.json){size}"
    if m.preset:
        return f"{m.preset} (random init){size}"
    return f"{m.from_config.get('model_type')} from model.from_config (random init){size}"
