"""Training data on CPU (issue 15): memory per rank against corpus size, prepare throughput
against the tokenizer's raw batch-encode speed, and time to the first step with prepared data.

    python bench/data_bench.py --work /tmp/data-bench [--sizes 25,200] [--old OLD_CHECKOUT]

Everything is generated here (no downloads): jsonl corpora of synthetic English-like documents
(words drawn with the frequencies of jobs/data/corpus.txt, 5% random letter strings for a long
tail, lengths log-normal around 1.5 kB), a byte-level BPE with a 32k vocabulary trained with
the `tokenizers` library on a 4 MB sample and saved as a HF tokenizer folder, and the byte
tokenizer. Measured in one run, side by side:

- raw: `backend_tokenizer.encode_batch_fast` on the corpus text in 1 MB batches, one process,
  one thread (TOKENIZERS_PARALLELISM=false), MB of text per CPU second;
- prepare: `python -m clusterfsdp.data.prepare` (what `clusterfsdp data prepare` runs) with
  2 processes on the same corpus file, MB per CPU second of the whole process tree (so other
  load on the machine does not count against it) and MB/s of wall time;
- training: 2 real gloo ranks (`clusterfsdp.worker` on a run folder, llama-tiny, 30 steps) on
  each prepared corpus; each rank reports its peak RSS (ru_maxrss) when it exits, and rank 0's
  log gives the time from the start of training to the first step and how long the data and
  the model took. With --old, the same training on the 25 MB corpus with the code of an older
  checkout (every rank tokenizing the whole corpus into memory) for comparison.

With `--slurm MB` (issue 24) it measures only this: a corpus of MB prepared with the BPE by a
Slurm job array of 1 node and then of 2 nodes of the devcluster (`data prepare --executor slurm
--nodes N --follow`, whole nodes, a process per CPU), the wall time of each and their ratio, and
the tokenizing speed per CPU second of the units against the raw encoder.

Prints a RESULT line per measurement (JSON) and a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from common import ROOT

sys.path.insert(0, str(ROOT / "tests"))
from procs import launch, wait  # the tests' launcher of real worker ranks

CORPUS = ROOT / "jobs" / "data" / "corpus.txt"


def result(**fields) -> dict:
    print("RESULT " + json.dumps(fields), flush=True)
    return fields


# ---------------------------------------------------------------- inputs
def make_corpus(path: Path, megabytes: int, seed: int) -> Path:
    """jsonl of synthetic documents, `megabytes` MB of text."""
    import numpy as np

    if path.exists():
        return path
    counts = Counter(CORPUS.read_text().split())
    words = list(counts)
    p = np.array([counts[w] for w in words], dtype=np.float64)
    p /= p.sum()
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    tmp = path.with_suffix(".tmp")
    written = 0
    with open(tmp, "w") as f:
        while written < megabytes * 1_000_000:
            n = 200_000
            chosen = rng.choice(len(words), size=n, p=p)
            rare = rng.random(n) < 0.05
            tokens = [
                "".join(rng.choice(letters, size=rng.integers(3, 10))) if r else words[c]
                for c, r in zip(chosen.tolist(), rare.tolist(), strict=True)
            ]
            lengths = np.maximum(5, rng.lognormal(np.log(250), 0.8, size=n // 50).astype(int))
            at = 0
            for length in lengths.tolist():
                if at >= n:
                    break
                line = json.dumps({"text": " ".join(tokens[at : at + length])}) + "\n"
                f.write(line)
                written += len(line)
                at += length
    os.replace(tmp, path)
    return path


def make_bpe(folder: Path, sample: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if (folder / "tokenizer.json").is_file():
        return folder
    texts = []
    with open(sample) as f:
        size = 0
        for line in f:
            texts.append(json.loads(line)["text"])
            size += len(texts[-1])
            if size > 4_000_000:
                break
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=32000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(texts, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>").save_pretrained(folder)
    return folder


RAW = r"""
import json, sys, time
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(sys.argv[1]).backend_tokenizer
batch, size, total = [], 0, 0
t0, c0 = time.perf_counter(), time.process_time()
with open(sys.argv[2]) as f:
    for line in f:
        batch.append(json.loads(line)["text"]); size += len(batch[-1])
        if size >= 1 << 20:
            tok.encode_batch_fast(batch, add_special_tokens=False); total += size; batch, size = [], 0
tok.encode_batch_fast(batch, add_special_tokens=False); total += size
print(json.dumps({"text_mb": total / 1e6, "cpu_s": time.process_time() - c0, "wall_s": time.perf_counter() - t0}))
"""


def raw_speed(tokenizer: Path, corpus: Path) -> dict:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
    out = subprocess.run(
        [sys.executable, "-c", RAW, str(tokenizer), str(corpus)], capture_output=True, text=True, env=env, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def job_text(name: str, run_root: Path, corpus: Path, tokenizer: str, packing: str = "", cache: str = "") -> str:
    """A 2-rank llama-tiny job on `corpus` (keys an older checkout also reads, unless packing or cache)."""
    return f"""
[job]
name = "{name}"
run_root = "{run_root}"
[slurm]
tasks_per_node = 2
[model]
preset = "llama-tiny"
[data]
source = "files"
paths = ["{corpus}"]
tokenizer = "{tokenizer}"
seq_len = 256
{f'packing = "{packing}"' if packing else ""}
{f'cache_dir = "{cache}"' if cache else ""}
[train]
steps = 30
micro_batch_size = 8
log_every = 10
[fsdp]
sharding = "full"
mixed_precision = "fp32"
"""


def tree_cpu(root: int, last: dict[int, float]) -> None:
    """Record the CPU seconds (user + system) of `root` and every process below it, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    parent, cpu = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(stat.parent.name)
        parent[pid], cpu[pid] = int(fields[1]), (int(fields[11]) + int(fields[12])) / tick
    for pid, seconds in cpu.items():
        up = pid
        while up not in (root, 0, 1) and up in parent:
            up = parent[up]
        if up == root:
            last[pid] = max(last.get(pid, 0.0), seconds)


def prepare(job_file: Path, workers: int) -> dict:
    """`python -m clusterfsdp.data.prepare` on a fresh cache: wall seconds, and CPU seconds of
    its whole process tree (main, forkserver, pool) polled every 0.2 s from /proc (the pool's
    processes are not children the bench could wait for; what a process spends after the last
    poll, at most 0.2 s of an idle shutdown, is not counted)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "clusterfsdp.data.prepare", str(job_file), "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    last: dict[int, float] = {}
    while proc.poll() is None:
        tree_cpu(proc.pid, last)
        time.sleep(0.2)
    wall, out = time.perf_counter() - t0, proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(out)
    units = re.search(r"([\d.]+) CPU-s tokenizing", out)  # absent when only an index was built
    return {"wall_s": wall, "cpu_s": sum(last.values()), "cpu_units_s": float(units.group(1)) if units else None}


def slurm_prepare(job_file: Path, nodes: int) -> dict:
    """`clusterfsdp data prepare --executor slurm --nodes N --follow` on a fresh cache (issue 24):
    wall seconds from queueing the array to the renamed dataset, and from its manifest the
    tokens and the CPU seconds its units took (all tasks)."""
    t0 = time.perf_counter()
    argv = ["-m", "clusterfsdp.cli", "data", "prepare", str(job_file), "--executor", "slurm", "--nodes", str(nodes)]
    out = subprocess.run([sys.executable, *argv, "--follow"], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        raise RuntimeError(out.stdout + out.stderr)
    cache = Path(re.search(r'cache_dir = "([^"]+)"', job_file.read_text()).group(1))  # type: ignore[union-attr]
    (manifest,) = [json.loads(p.read_text()) for p in cache.glob("*/manifest.json")]
    return {"wall_s": wall, "tokens": manifest["tokens"], "cpu_units_s": manifest["cpu_seconds"]}


def slurm_scaling(work: Path, mb: int, bpe: Path, corpus: Path) -> None:
    """The same corpus prepared by a 1-node and a 2-node array of the devcluster, one after the
    other in this run (needs `clusterfsdp devcluster up`; take its lock if others use it)."""
    raw = raw_speed(bpe, corpus)
    raw_rate = raw["text_mb"] / raw["cpu_s"]
    result(what="raw_encode", mb=mb, tokenizer="bpe32k", mb_per_cpu_s=raw_rate, **raw)
    walls = {}
    for nodes in (1, 2):
        job_file = work / f"job-slurm-{mb}-{nodes}.toml"
        text = job_text(
            f"s{mb}n{nodes}", work / "runs", corpus, str(bpe), cache=str(work / f"cache-slurm-{mb}-{nodes}")
        )
        job_file.write_text(text)
        prep = slurm_prepare(job_file, nodes)
        walls[nodes] = prep["wall_s"]
        unit_rate = raw["text_mb"] / prep["cpu_units_s"]
        result(
            what="slurm_prepare",
            mb=mb,
            nodes=nodes,
            tokens_per_s=prep["tokens"] / prep["wall_s"],
            tokens_per_unit_cpu_s=prep["tokens"] / prep["cpu_units_s"],
            mb_per_unit_cpu_s=unit_rate,
            ratio_to_raw=unit_rate / raw_rate,
            **prep,
        )
    result(what="slurm_scaling", mb=mb, wall_1_node_over_2_nodes=walls[1] / walls[2])


# Imports clusterfsdp from PYTHONPATH (the code of --old), not from the working directory ('' on
# sys.path: this checkout); PYTHONPATH also comes before the editable install's finder.
PRELUDE = "import sys; sys.path[:] = [p for p in sys.path if p]"
RANK = (
    PRELUDE
    + r"""
import resource
from clusterfsdp.worker.main import run
run(sys.argv[1])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""
)


def train(job: str, code: Path, world: int = 2) -> dict:
    """Create a run folder with the code at `code` and train it on `world` local gloo ranks."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    made = subprocess.run(
        [
            sys.executable,
            "-c",
            PRELUDE + "\nfrom clusterfsdp.core import spec, runfolder; "
            "print(runfolder.create_run(spec.loads(sys.stdin.read()), 'bench').path)",
        ],
        input=job,
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    run_dir = made.stdout.strip()
    procs = launch(["-c", RANK, run_dir], world, job_id="bench", extra_env={"PYTHONPATH": str(code)})
    results = wait(procs, timeout=3600)
    outs = [text for _, text in results]
    if any(code for code, _ in results):
        raise RuntimeError("\n".join(o[-3000:] for o in outs))
    rss = [int(re.search(r"MAXRSS_KB (\d+)", o).group(1)) / 1024 for o in outs]  # type: ignore[union-attr]
    first = re.search(
        r"first step done ([\d.]+) s after the start \(data ready in ([\d.]+) s, model built in ([\d.]+)", outs[0]
    )
    built = re.search(r"built in ([\d.]+) s", outs[0])
    return {
        "rss_mb": rss,
        "first_step_s": float(first.group(1)) if first else None,
        "data_s": float(first.group(2)) if first else None,
        "model_s": float(first.group(3)) if first else (float(built.group(1)) if built else None),
        "log": outs[0],
    }


# ---------------------------------------------------------------- the measurements
def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--sizes", default="25,200", help="corpus sizes in MB")
    ap.add_argument("--old", type=Path, help="an older checkout to compare the training memory with (25 MB only)")
    ap.add_argument("--repeat", type=int, default=3, help="raw / prepare alternations on the smallest corpus")
    ap.add_argument("--slurm", type=int, metavar="MB", help="only: a corpus of MB prepared by 1 vs 2 devcluster nodes")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    if args.slurm:
        corpus = make_corpus(work / f"corpus-{args.slurm}mb.jsonl", args.slurm, seed=args.slurm)
        result(what="machine", cpus=os.cpu_count(), load=os.getloadavg(), date=time.strftime("%Y-%m-%d %H:%M"))
        slurm_scaling(work, args.slurm, make_bpe(work / "bpe32k", corpus), corpus)
        result(what="done", load=os.getloadavg())
        return 0
    sizes = [int(s) for s in args.sizes.split(",")]
    corpora = {mb: make_corpus(work / f"corpus-{mb}mb.jsonl", mb, seed=mb) for mb in sizes}
    bpe = make_bpe(work / "bpe32k", corpora[sizes[0]])
    result(
        what="machine",
        cpus=os.cpu_count(),
        load=os.getloadavg(),
        date=time.strftime("%Y-%m-%d %H:%M"),
        corpora={mb: p.stat().st_size for mb, p in corpora.items()},
    )
    # 1. prepare throughput with the BPE against raw encoding, alternated (a fresh cache each time)
    for mb, corpus in corpora.items():
        for rep in range(args.repeat if mb == min(sizes) else 1):
            job_file = work / f"job-{mb}-bpe-{rep}.toml"
            cache = str(work / f"cache-{mb}-{rep}")
            job_file.write_text(job_text(f"p{mb}", work / "runs", corpus, str(bpe), cache=cache))
            raw = raw_speed(bpe, corpus)
            raw_rate = raw["text_mb"] / raw["cpu_s"]
            result(what="raw_encode", mb=mb, rep=rep, tokenizer="bpe32k", mb_per_cpu_s=raw_rate, **raw)
            prep = prepare(job_file, workers=2)
            mbs = raw["text_mb"]  # the same text the raw encoder got (the file also holds JSON syntax)
            result(
                what="prepare",
                mb=mb,
                rep=rep,
                tokenizer="bpe32k",
                mb_per_s=mbs / prep["wall_s"],
                mb_per_cpu_s=mbs / prep["cpu_s"],
                mb_per_unit_cpu_s=mbs / prep["cpu_units_s"],
                ratio=(mbs / prep["cpu_s"]) / raw_rate,
                **prep,
            )
    # 2. memory per rank and time to the first step, byte tokenizer, prepared beforehand
    for mb, corpus in corpora.items():
        for packing in ("concat", "documents"):
            text = job_text(f"t{mb}{packing}", work / "runs", corpus, "bytes", packing, cache=str(work / "cache-bytes"))
            (work / "train.toml").write_text(text)
            prep = prepare(work / "train.toml", workers=2)
            result(what="prepare", mb=mb, tokenizer="bytes", packing=packing, **prep)
            t = train(text, ROOT)
            result(what="train", mb=mb, packing=packing, code="new", **{k: v for k, v in t.items() if k != "log"})
    if args.old:  # every rank tokenizes the whole corpus into memory (concat, its own cache folder)
        mb = min(sizes)
        t = train(job_text(f"old{mb}", work / "runs-old", corpora[mb], "bytes"), args.old)
        result(what="train", mb=mb, packing="concat", code="old", **{k: v for k, v in t.items() if k != "log"})
    result(what="done", load=os.getloadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
