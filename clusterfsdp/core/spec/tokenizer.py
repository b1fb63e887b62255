"""`data.tokenizer = 'auto'` (the default): the tokenizer of the pretrained model when its folder
has one, else the built-in byte tokenizer. Decided as soon as the model is a local folder: when
the job is parsed (no model, or an absolute folder), when its paths are made absolute (a folder
relative to the job file), or by `modelsource.prepare` once a hub id is a snapshot folder. So
every run's job.toml, and every spec a worker sees, names a concrete tokenizer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from .schema import JobSpec

# A folder holds a tokenizer when it has one of these (AutoTokenizer needs one of them).
TOKENIZER_MARKERS = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")


def has_tokenizer(folder: Path) -> bool:
    return any((folder / name).is_file() for name in TOKENIZER_MARKERS)


def default_tokenizer(spec: JobSpec) -> JobSpec:
    """`data.tokenizer = 'auto'` decided once the model is a local folder: the tokenizer of
    model.name_or_path when that folder has one (a pretrained model trains on the ids it knows),
    else 'bytes'. It stays 'auto' while name_or_path is a hub id or a relative folder (decided
    later, see the module docstring). A decision that gives chat data no tokenizer is reported
    by the caller with `chat_problem`."""
    d, m = spec.data, spec.model
    if d.tokenizer != "auto":
        return spec
    folder = Path(m.name_or_path)
    if m.name_or_path and not _is_local_folder(folder):
        return spec
    chosen = str(folder) if m.name_or_path and has_tokenizer(folder) else "bytes"
    return dataclasses.replace(spec, data=dataclasses.replace(d, tokenizer=chosen))


def chat_problem(spec: JobSpec) -> str | None:
    """Chat data needs a tokenizer with a chat template; the byte tokenizer has none."""
    if spec.data.format != "chat" or spec.data.tokenizer != "bytes":
        return None
    why = " (model.name_or_path has no tokenizer files: set data.tokenizer)" if spec.model.name_or_path else ""
    return f"data.format: 'chat' needs a tokenizer with a chat template; data.tokenizer = 'bytes' has none{why}"


def _is_local_folder(folder: Path) -> bool:
    try:
        return folder.is_absolute() and folder.is_dir()
    except (OSError, ValueError):  # a name too long for a path: not a folder here
        return False
