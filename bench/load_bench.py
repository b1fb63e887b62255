"""Loading a pretrained model on 4 CPU ranks (issue 14): peak host memory per rank and throughput.

Writes a model of at least 1 GB (fp32, a Llama shape by default, untied lm_head) with
`save_pretrained`, then, in one run and one after the other, 4 gloo ranks load it:

- `fsdp2`: clusterfsdp's path (`build.build_model`, FSDP2): transformers' loader on the sharded model,
  every rank reading only its own slices;
- `fsdp1`: clusterfsdp's FSDP1 path: a staging copy sharded and loaded like `fsdp2`, gathered one
  decoder layer at a time while FSDP1 wraps it;
- `before`: the path before issue 14, for comparison: every rank reads the whole file
  (`safetensors.torch.load_file`) and `set_model_state_dict(full_state_dict=True)` shards it;
- `cat`: `cat <files> > /dev/null`, the disk (or page cache) speed the loads are compared with.

Per rank it reports the peak RSS increase during the load (VmHWM after resetting it through
/proc/self/clear_refs; the local shards are read once after loading, so memory-mapped shards
count too) as a fraction of the file size, split at the end into anonymous and file-backed
memory; and the wall time of `build.build_model` (meta build + sharding + load) as GB/s of the file.
`--cold` drops the files from the page cache (posix_fadvise DONTNEED) before every measurement.

    python3 bench/load_bench.py                     # builds /tmp/cfsdp-load-bench/model once
    python3 bench/load_bench.py --cold --repeat 2
    python3 bench/load_bench.py --family mixtral    # fused experts (w1/w3 -> gate_up_proj)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, result

sys.path.insert(0, str(ROOT / "tests"))
from procs import launch, wait  # the tests' torchrun-style local launcher

SHAPES = {
    # 302M parameters, 1.21 GB in fp32
    "llama": dict(
        model_type="llama",
        vocab_size=32000,
        hidden_size=1536,
        intermediate_size=4096,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=False,
    ),
    # 272M parameters, 1.09 GB in fp32: 8 experts of 1024 x 1536
    "mixtral": dict(
        model_type="mixtral",
        vocab_size=32000,
        hidden_size=1024,
        intermediate_size=1536,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        num_local_experts=8,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    ),
}

MAKE = r"""
import json, sys, torch
from transformers import AutoConfig, AutoModelForCausalLM
keys = json.loads(sys.argv[2])
config = AutoConfig.for_model(keys.pop("model_type"), **keys)
torch.manual_seed(0)
AutoModelForCausalLM.from_config(config).save_pretrained(sys.argv[1])
"""

RANK = r"""
import json, os, sys, time, torch, torch.distributed as dist
from pathlib import Path
from clusterfsdp.core import spec as S
from clusterfsdp.worker import build, distenv

def status(key):
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)

approach, folder = sys.argv[1], sys.argv[2]
os.environ.update(distenv.from_environ().export())
dist.init_process_group("gloo")
world = dist.get_world_size()
job = (f'[model]\nname_or_path = "{folder}"\n[fsdp]\nversion = {1 if approach == "fsdp1" else 2}\n'
       f'sharding = "full"\nmixed_precision = "fp32"\n[slurm]\ntasks_per_node = {world}\n')
spec = S.loads(job)
if approach == "before":
    spec = S.loads(job.replace(f'name_or_path = "{folder}"', f'config = "{folder}"'))
from clusterfsdp.worker import model as modelmod
import transformers.conversion_mapping  # noqa: F401  (imports are not loading: done before timing)
modelmod.build_meta(spec.model, modelmod.build_config(spec.model))
dist.barrier()
base = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
t0 = time.perf_counter()
if approach == "before":  # the code before issue 14: every rank reads the whole file
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    model, _, _ = build.build_model(spec, torch.device("cpu"), world, None, resume=True)  # to_empty + buffers
    state = {}
    for f in sorted(Path(folder).glob("*.safetensors")):
        state.update(load_file(str(f)))
    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
    del state
else:
    model, _, _ = build.build_model(spec, torch.device("cpu"), world, None)
checksum = 0.0
for p in model.parameters():  # read every local shard once (memory-mapped pages come in here)
    checksum += float((p.to_local() if hasattr(p, "to_local") else p).sum(dtype=torch.float64))
seconds = time.perf_counter() - t0
dist.barrier()
print("RANK " + json.dumps({"rank": dist.get_rank(), "seconds": seconds, "peak": status("VmHWM") - base,
      "anon": status("RssAnon"), "file": status("RssFile"), "checksum": checksum}), flush=True)
dist.destroy_process_group()
"""


def files_of(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.safetensors"))


def drop_cache(files: list[Path]) -> None:
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_ranks(approach: str, folder: Path, world: int) -> list[dict]:
    out = wait(launch(["-c", RANK, approach, str(folder)], world), timeout=1800)
    if any(code != 0 for code, _ in out):
        raise SystemExit(f"{approach}: a rank failed:\n" + "\n".join(text[-3000:] for _, text in out))
    rows = [json.loads(line[5:]) for _, text in out for line in text.splitlines() if line.startswith("RANK ")]
    return sorted(rows, key=lambda r: r["rank"])


def time_cat(files: list[Path]) -> float:
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("--dir", default="/tmp/cfsdp-load-bench")
    p.add_argument("--family", choices=sorted(SHAPES), default="llama")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--approaches", default="cat,fsdp2,fsdp1,before")
    p.add_argument("--cold", action="store_true", help="drop the files from the page cache before each step")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    folder = Path(a.dir) / a.family
    if not files_of(folder):
        print(f"writing the {a.family} model to {folder} ...", flush=True)
        subprocess.run([sys.executable, "-c", MAKE, str(folder), json.dumps(SHAPES[a.family])], check=True)
    files = files_of(folder)
    size = sum(f.stat().st_size for f in files)
    time_cat(files)  # warm: every measurement starts from the same page-cache state
    rows: dict[str, list] = {}
    for _ in range(a.repeat):
        for approach in a.approaches.split(","):
            if a.cold:
                drop_cache(files)
            if approach == "cat":
                rows.setdefault("cat", []).append(time_cat(files))
            else:
                rows.setdefault(approach, []).append(run_ranks(approach, folder, a.world))
    cat_s = statistics.median(rows["cat"]) if "cat" in rows else None
    print(
        f"\nmodel {a.family}: {size / 1e9:.2f} GB in {len(files)} file(s); {a.world} ranks; "
        f"page cache {'dropped' if a.cold else 'warm'}; load 1: {os.getloadavg()[0]:.1f}"
    )
    if cat_s:
        print(f"{'cat > /dev/null':<12} {cat_s:8.2f} s  {size / 1e9 / cat_s:6.2f} GB/s")
    for approach, runs in rows.items():
        if approach == "cat":
            continue
        seconds = statistics.median(max(r["seconds"] for r in ranks) for ranks in runs)
        ratios = [max(ranks[k]["peak"] for ranks in runs) / size for k in range(a.world)]
        last = runs[-1]
        print(
            f"{approach:<12} {seconds:8.2f} s  {size / 1e9 / seconds:6.2f} GB/s"
            + (f" ({cat_s / seconds:.2f} x cat)" if cat_s else "")
            + "  peak RSS / model per rank: "
            + " ".join(f"{x:.2f}" for x in ratios)
            + "  (end: anon "
            + " ".join(f"{r['anon'] / size:.2f}" for r in last)
            + ", file "
            + " ".join(f"{r['file'] / size:.2f}" for r in last)
            + ")"
        )
        checks = {round(sum(r["checksum"] for r in ranks), 2) for ranks in runs}
        result(
            "load",
            approach=approach,
            family=a.family,
            world=a.world,
            cold=a.cold,
            model_bytes=size,
            seconds=seconds,
            gb_per_s=size / 1e9 / seconds,
            cat_seconds=cat_s,
            peak_rss_ratio=ratios,
            checksums=sorted(checks),
        )


if __name__ == "__main__":
    main()
