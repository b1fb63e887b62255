"""The base model a LoRA checkpoint was trained on, and whether the base a run would resume (or
merge) on is still that one. Adapters fit only their base: on another one they load without an
error and mean nothing, which is the silent kind of wrong. Torch-free, so that `resume` refuses a
changed base before anything is queued; the ranks check again before loading it (a requeue after
someone replaced the base) and so does `export --merge` (worker/adapters.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from . import spec as specmod
from .modelsource import safetensors_header, weight_files

BASE_KEY = "peft_base"  # the base reference in a checkpoint's clusterfsdp.json


def reference(spec: specmod.JobSpec) -> dict[str, Any]:
    """The base model a LoRA checkpoint needs: its resolved folder and hub commit (as the run's
    job.toml records them), and each weight file's name, size, modification time, blob (hub
    cache) and header digest: cheap to recompute at every save, and a replaced, rewritten or
    re-downloaded base shows without reading the tensors."""
    folder = Path(spec.model.name_or_path)
    files = {}
    for f in weight_files(folder):
        header = json.dumps(safetensors_header(f), sort_keys=True).encode()
        stat = f.stat()
        files[f.name] = {
            "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns,
            "blob": f.resolve().name,  # a hub snapshot's file links to its blob, named by its content hash
            "header_sha256": hashlib.sha256(header).hexdigest(),
        }
    return {"folder": str(folder), "revision": spec.model.revision, "files": files}


def problem(spec: specmod.JobSpec, meta: dict[str, Any]) -> str | None:
    """Why the adapters of a checkpoint (its clusterfsdp.json `meta`) do not fit the base `spec`
    names now, in one line; None when they do."""
    saved = meta.get(BASE_KEY)
    if saved is None:
        return "peft: the checkpoint to resume holds a full model, not adapters (was peft.method changed since?)"
    try:
        now = reference(spec)
    except (OSError, ValueError) as e:
        return f"model.name_or_path: the base model cannot be read ({e}): resume refused, the adapters fit only it"
    if saved == now:
        return None
    what = (
        "folder"
        if saved.get("folder") != now["folder"]
        else "commit"
        if saved.get("revision") != now["revision"]
        else "weight files"
    )
    return (
        f"model.name_or_path: the base model's {what} changed since the adapters were trained "
        f"({saved.get('folder')} @ {saved.get('revision') or 'local'}): resume refused, the adapters fit only "
        "that base"
    )
