"""Shared by the benchmark scripts: the job spec of the 1B benchmark and version facts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterfsdp.core.spec import JobSpec

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def python_for(tree: Path | None) -> list[str]:
    """The interpreter command that imports clusterfsdp from `tree` (None: this checkout, through
    the venv's editable install). Another tree (an older commit, `git archive`d and unpacked, with
    `clusterfsdp/tui` linked to its `tui/`) goes ahead of site-packages on $PYTHONPATH with
    `python -S`, since the editable install's finder would otherwise import this one; run the
    command outside this checkout (the current directory comes first on sys.path)."""
    if tree is None:
        return [sys.executable]
    import os

    site = next(p for p in sys.path if p.endswith("site-packages"))
    os.environ["PYTHONPATH"] = f"{tree.resolve()}:{site}"
    return [sys.executable, "-S"]


def bench_job(
    *,
    name: str,
    run_root: str,
    preset: str = "llama-1b",
    seq: int = 2048,
    bs: int = 8,
    steps: int = 30,
    log_every: int = 5,
    compile: bool = True,
    reshard: bool = True,
    ac: bool = False,
    mixed_precision: str = "bf16",
    ckpt_every: int = 0,
    ckpt_async: bool = False,
    gpus: int = 1,
    overrides: Sequence[str] = (),
) -> JobSpec:
    """The benchmark's job spec: random-init preset, synthetic tokens, FSDP2 on one node."""
    from clusterfsdp.core import spec as specmod

    data = {
        "job": {"name": name, "run_root": run_root, "seed": 0},
        "slurm": {"nodes": 1, "gpus_per_node": gpus},
        "model": {"preset": preset, "dtype": "float32"},
        "data": {"source": "synthetic", "seq_len": seq},
        "train": {
            "steps": steps,
            "micro_batch_size": bs,
            "grad_accum": 1,
            "lr": 3e-4,
            "warmup": 10,
            "log_every": log_every,
        },
        "fsdp": {
            "version": 2,
            "sharding": "full",
            "reshard_after_forward": reshard,
            "mixed_precision": mixed_precision,
            "compile": compile,
            "activation_checkpointing": ac,
        },
        "checkpoint": {"every_steps": ckpt_every, "keep_last": 1, "async": ckpt_async},
    }
    specmod.apply_overrides(data, list(overrides))
    return specmod.with_absolute_paths(specmod.from_dict(data), Path.cwd())


def tiny_run_folder(tmp: Path, name: str, steps: int) -> Path:
    """A new run folder under `tmp`/runs: llama-tiny on the shipped corpus, seq_len 64, micro-batch
    2, fp32, `steps` steps (the cold and forked rank benchmarks' job)."""
    from clusterfsdp.core import runfolder
    from clusterfsdp.core import spec as S
    from clusterfsdp.core.records import Executor

    text = f"""
[job]
name = "{name}"
[model]
preset = "llama-tiny"
[data]
source = "files"
paths = ["{ROOT / "jobs" / "data" / "corpus.txt"}"]
seq_len = 64
[train]
steps = {steps}
micro_batch_size = 2
warmup = 0
log_every = 1
[fsdp]
mixed_precision = "fp32"
"""
    spec = S.loads(text, [f"job.run_root={str(tmp / 'runs')!r}"])
    return runfolder.create_run(spec, Executor.LOCAL).path


def versions() -> dict:
    import torch
    import transformers

    out = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "python": sys.version.split()[0],
    }
    if torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(0)
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))  # pyright: ignore[reportAttributeAccessIssue]
    try:
        import triton  # pyright: ignore[reportMissingImports]  (GPU builds only)

        out["triton"] = triton.__version__
    except ImportError:
        pass
    return out


def result(bench: str, **values) -> None:
    print("RESULT", json.dumps({"bench": bench, **values}), flush=True)
