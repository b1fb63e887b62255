"""Checkpoint timings of the real Checkpointer on one GPU (issue 5).

Builds the benchmark model and optimizer (`worker.build.build_model`, `worker.optimizer.adamw`; FSDP2, 1 rank),
takes one training step so AdamW's state exists, then times on one filesystem:

- raw write bandwidth of that disk: `dd if=/dev/zero bs=64M conv=fsync` (same call);
- `Checkpointer.save(blocking=True)`: synchronous DCP save, fsync'ed, renamed into place;
- `Checkpointer.save()` with checkpoint.async = true: seconds the caller is blocked, and the
  seconds until the background write is complete;
- candidate changes (not used by the Checkpointer yet): a FileSystemWriter with several threads;
  async saves whose host copy is kept in pinned buffers between saves (see `stagers`);
- `Checkpointer.load()` from the page cache and, where the kernel lets us drop caches, cold;
  after loading, the weights must equal the saved ones (a training step in between moved them).

Checkpoints off the critical path (issue 17), parts that also mean something on CPU:

- `threads`: `Checkpointer.save(blocking=True)` with 1, 2, 4, 8 writer threads, against `dd`;
- `modes`: async saves from a thread and from a saver process (`checkpoint.async_mode`): the
  Checkpointer's construction (its staging buffers are made there, before the first save),
  seconds blocked per save, seconds until written, and training steps/s while the save is
  written against steps/s with no save in flight, in the same call;
- `prune`: seconds the training thread is blocked deleting an old checkpoint: the rename into
  `.pruning/` the Checkpointer does, against the `rmtree` it did before, on copies of one checkpoint.

    python3 bench/ckpt_bench.py --dir /tmp/cfsdp-ckpt
    python3 bench/ckpt_bench.py --preset llama-tiny --seq 128 --cpu     # smoke test
    python3 bench/ckpt_bench.py --cpu --preset llama-small --seq 128 --parts dd,threads,modes,prune \
        --set 'model.from_config={hidden_size=1024,intermediate_size=4096,num_hidden_layers=8}'  # issue 17, CPU
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import bench_job, result, versions


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def dd(folder: Path, gib: int) -> dict:
    target = folder / "dd.bin"
    count = max(1, gib * 16)
    t0 = time.perf_counter()
    out = subprocess.run(
        ["dd", "if=/dev/zero", f"of={target}", "bs=64M", f"count={count}", "conv=fsync"], capture_output=True, text=True
    )
    secs = time.perf_counter() - t0
    size = target.stat().st_size if target.exists() else 0
    target.unlink(missing_ok=True)
    last = (out.stderr.strip().splitlines() or [""])[-1]
    return {"bytes": size, "s": round(secs, 2), "gb_s": round(size / secs / 1e9, 2), "dd_says": last}


def drop_caches() -> bool:
    try:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def thread_sweep(ck_root: Path, make, meta: dict, size_of, dd_gb_s: float | None) -> list[dict]:
    """Blocking saves with 1, 2, 4 and 8 writer threads (one checkpoint folder each, removed after)."""
    rows = []
    for n, threads in enumerate((1, 2, 4, 8)):
        saver = make(ck_root / f"threads-{threads}", writer_threads=threads)
        secs = saver.save(n + 1, meta, blocking=True)
        size = size_of(saver.root)
        rows.append({"threads": threads, "s": round(secs, 2), "gb_s": round(size / secs / 1e9, 3)})
        if dd_gb_s:
            rows[-1]["vs_dd"] = round(size / secs / 1e9 / dd_gb_s, 2)
        print("writer threads", rows[-1], flush=True)
        saver.close()
        shutil.rmtree(saver.root, ignore_errors=True)
    return rows


def steps_per_s(step, until, min_steps: int = 3) -> tuple[float, int]:
    """Training steps/s until `until()` is true (at least `min_steps` steps)."""
    t0, n = time.perf_counter(), 0
    while n < min_steps or not until():
        step()
        n += 1
    return n / (time.perf_counter() - t0), n


def async_modes(ck_root: Path, make, meta: dict, step, repeat: int) -> dict:
    """Thread- and process-based async saves: blocked, written, steps/s while writing vs idle."""
    out: dict = {}
    for mode in ("thread", "process"):
        t0 = time.perf_counter()
        saver = make(ck_root / f"async-{mode}", async_=True, async_mode=mode)
        rows: list[dict] = [{"construct_s": round(time.perf_counter() - t0, 2)}]
        for i in range(repeat):
            idle, _ = steps_per_s(step, lambda: True)
            t0 = time.perf_counter()
            blocked = saver.save(100 + i, meta)
            busy, n = steps_per_s(step, lambda p=saver._pending: p is None or p[0].done())
            saver.wait()
            rows.append(
                {
                    "blocked_s": round(blocked, 3),
                    "written_s": round(time.perf_counter() - t0, 2),
                    "steps_s_idle": round(idle, 3),
                    "steps_s_while_writing": round(busy, 3),
                    "ratio": round(busy / idle, 2),
                    "steps_during": n,
                }
            )
            print("async", mode, rows[-1], flush=True)
        saver.close()
        shutil.rmtree(saver.root, ignore_errors=True)
        out[mode] = rows
    return out


def prune_cost(ck_root: Path, make, meta: dict, copies: int) -> dict:
    """Blocked seconds to delete a checkpoint: `rmtree` inline (before) vs the Checkpointer's
    rename into `.pruning/` (now), each on its own copy of the same checkpoint."""
    from clusterfsdp.core import ckptfolder

    saver = make(ck_root / "prune", writer_threads=4)
    saver.save(1, meta, blocking=True)
    first = ckptfolder.step_dir(saver.root, 1)
    rows = []
    for i in range(copies):
        a, b = saver.root / f"copy-a{i}", saver.root / f"copy-b{i}"
        for c in (a, b):
            subprocess.run(["cp", "-r", str(first), str(c)], check=True)
        os.sync()
        t0 = time.perf_counter()
        shutil.rmtree(a)
        inline = time.perf_counter() - t0
        pruner = saver._pruner
        assert pruner is not None
        t0 = time.perf_counter()
        pruner.prune([b])
        renamed = time.perf_counter() - t0
        pruner._last.result()
        rows.append(
            {
                "rmtree_s": round(inline, 4),
                "rename_s": round(renamed, 5),
                "background_s": round(time.perf_counter() - t0, 4),
            }
        )
        print("prune", rows[-1], flush=True)
    saver.close()
    shutil.rmtree(saver.root, ignore_errors=True)
    return {"rows": rows}


def stagers(a, parts, out, root, async_saver, sync, room) -> None:
    """Async saves whose host copy lives in pinned buffers kept between saves (what the Checkpointer
    could use), two saves each: the first allocates and pins the buffers, the later ones reuse them.

    - pinned_cached: `BlockingAsyncStager(cache_staged_state_dict=True)`: the caller waits for the
      device-to-host copy only, then the write runs in the background;
    - pinned_async: `DefaultStager` with pinned memory and the copy on a side stream; the caller
      waits only for the planning, `staged_s` is when the copy is done (the next optimizer step
      must wait for it). On torch 2.11 its second save fails with KeyError: <class 'type'>
      (its copy dispatch table is cleared, apparently because that `async_save` closes the
      caller's stager after each save; newer torch closes only stagers it made itself).
    """
    from torch.distributed.checkpoint.staging import BlockingAsyncStager, DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import async_save

    makers = {
        "pinned_cached": lambda: BlockingAsyncStager(cache_staged_state_dict=True),
        "pinned_async": lambda: DefaultStager(StagingOptions(True, False, True, True)),
    }
    for name in [n for n in makers if n in parts]:
        stager = makers[name]()
        rows = out[name] = []  # (rows so far are reported if a later save fails)
        for i in range(max(2, a.repeat)):
            if not room(name):
                break
            target = root / f"{name}-{i}"
            sync()
            t0 = time.perf_counter()
            res: Any = async_save(
                async_saver._state(), checkpoint_id=str(target), process_group=async_saver._pg, async_stager=stager
            )
            blocked = time.perf_counter() - t0
            staged = None
            if hasattr(res, "staging_completion"):
                res.staging_completion.result()
                staged = time.perf_counter() - t0
                res = res.upload_completion
            res.result()
            rows.append(
                {
                    "blocked_s": round(blocked, 3),
                    "staged_s": round(staged, 3) if staged else None,
                    "done_s": round(time.perf_counter() - t0, 2),
                }
            )
            print("async save", name, rows[-1], flush=True)
            shutil.rmtree(target, ignore_errors=True)
        stager.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", default=os.environ.get("BENCH_CKPT_DIR", "/tmp/cfsdp-ckpt"))
    p.add_argument("--preset", default="llama-1b")
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--bs", type=int, default=2)
    p.add_argument("--repeat", type=int, default=2, help="saves of each kind")
    p.add_argument("--dd-gib", type=int, default=8)
    p.add_argument(
        "--parts",
        default="dd,sync,writer,async,pinned_cached,pinned_async,load",
        help="what to measure (comma list; see the module docstring)",
    )
    p.add_argument("--writer-threads", type=int, default=8, help="FileSystemWriter threads for the 'writer' part")
    p.add_argument("--budget-s", type=float, default=0, help="skip saves that would end past this many seconds")
    p.add_argument("--cpu", action="store_true")
    p.add_argument("--set", action="append", default=[], help="job.toml override for the model (repeatable)")
    a = p.parse_args()
    parts = set(a.parts.split(","))
    t_start = time.perf_counter()

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_saver import save

    from clusterfsdp.core import ckptfolder
    from clusterfsdp.core import spec as specmod
    from clusterfsdp.data.samples import Batch
    from clusterfsdp.worker import build, distenv, optimizer, train
    from clusterfsdp.worker import checkpoint as ckpt

    env = distenv.from_environ()
    os.environ.update(env.export())
    if a.cpu:
        device, backend = torch.device("cpu"), "gloo"
    else:
        device, backend = torch.device("cuda", 0), "nccl"
        torch.cuda.set_device(device)
    dist.init_process_group(backend, device_id=device if backend == "nccl" else None)
    root = Path(a.dir)
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    spec = bench_job(
        name="ckpt",
        run_root=str(root / "runs"),
        preset=a.preset,
        seq=a.seq,
        bs=a.bs,
        compile=False,
        mixed_precision="fp32" if a.cpu else "bf16",
        gpus=0 if a.cpu else 1,
        overrides=a.set,
    )
    spec_text = specmod.dumps(spec)
    model, config, counts = build.build_model(spec, device, 1, None)
    opt = optimizer.adamw(spec, model, device)
    loss_fn = train._loss_fn(spec)
    gen = torch.Generator().manual_seed(0)

    def step() -> float:
        tokens = torch.randint(0, config.vocab_size, (a.bs, a.seq + 1), generator=gen)
        loss = loss_fn(model, Batch(tokens[:, :-1], tokens[:, 1:]).to(device)) / (a.bs * a.seq)  # (a sum)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    step()
    sync()
    out: dict = {
        "n_params": counts.total,
        "disk": subprocess.run(["df", "-h", str(root)], capture_output=True, text=True).stdout.strip().splitlines()[-1],
    }
    if "dd" in parts:
        out["dd"] = dd(root, a.dd_gib)
        print("dd", out["dd"], flush=True)
    meta0 = {"consumed": 0, "tokens_seen": 0}

    def make(folder: Path, **kw) -> Any:
        """A Checkpointer keeping 1 checkpoint, with the given [checkpoint] fields."""
        section = specmod.CheckpointSection(keep_last=1, **kw)
        return ckpt.Checkpointer(folder, model, opt, section, spec_text=spec_text)

    if "threads" in parts:
        out["threads"] = thread_sweep(root, make, meta0, du, out.get("dd", {}).get("gb_s"))
    if "modes" in parts:
        out["modes"] = async_modes(root, make, meta0, step, a.repeat)
    if "prune" in parts:
        out["prune"] = prune_cost(root, make, meta0, a.repeat)

    meta = {"consumed": 0, "tokens_seen": 0}
    est = {"save_s": 0.0}  # duration of the last save, to stay inside --budget-s

    def room(kind: str) -> bool:
        ok = not a.budget_s or time.perf_counter() - t_start + 1.5 * est["save_s"] + 10 < a.budget_s
        if not ok:
            print(f"skipping {kind}: --budget-s {a.budget_s} reached", flush=True)
        return ok

    ck = root / "checkpoints"
    sync_saver = make(ck)
    saves = []
    step_no = 0
    for _ in range(a.repeat if "sync" in parts else int("load" in parts)):
        if saves and not room("sync save"):
            break
        step_no += 1
        sync()
        secs = sync_saver.save(step_no, meta, blocking=True)
        est["save_s"] = secs
        size = du(ckptfolder.step_dir(ck, step_no))
        saves.append({"s": round(secs, 2), "gb": round(size / 1e9, 2), "gb_s": round(size / secs / 1e9, 2)})
        print("sync save", saves[-1], flush=True)
    out["sync"] = saves  # (at least one when loading: the load part reads it back)

    if "writer" in parts and room("writer"):
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        target = root / "writer"
        sync()
        t0 = time.perf_counter()
        save(sync_saver._state(), storage_writer=FileSystemWriter(str(target), thread_count=a.writer_threads))
        secs = time.perf_counter() - t0
        size = du(target)
        out["writer"] = {"threads": a.writer_threads, "s": round(secs, 2), "gb_s": round(size / secs / 1e9, 2)}
        print("sync dcp.save, FileSystemWriter threads", out["writer"], flush=True)
        shutil.rmtree(target, ignore_errors=True)

    async_saver = make(ck, async_=True)
    asyncs = []
    for _ in range(a.repeat if "async" in parts else 0):
        if not room("async save"):
            break
        step_no += 1
        sync()
        t0 = time.perf_counter()
        blocked = async_saver.save(step_no, meta)
        while async_saver._pending is not None and not async_saver._pending[0].done():
            time.sleep(0.01)
        async_saver.wait()
        total = time.perf_counter() - t0
        asyncs.append({"blocked_s": round(blocked, 3), "done_s": round(total, 2)})
        print("async save (Checkpointer)", asyncs[-1], flush=True)
    out["async"] = asyncs

    if parts & {"pinned_cached", "pinned_async"} and device.type == "cuda":
        try:
            stagers(a, parts, out, root, async_saver, sync, room)
        except Exception as e:
            out["stagers_error"] = f"{type(e).__name__}: {e}"[:300]
            print("stagers failed:", out["stagers_error"], flush=True)

    # load: move the weights with a training step, load the last checkpoint, compare
    info = ckptfolder.find(ck)
    probe = next(iter(model.parameters()))
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t
    saved_sum = float(local(probe.detach()).double().sum())
    loads = []
    for cold in (False, True) if "load" in parts else ():
        assert info is not None, f"no complete checkpoint in {ck}"
        step()
        sync()
        moved = float(local(probe.detach()).double().sum())
        dropped = drop_caches() if cold else False
        if cold and not dropped:
            break
        t0 = time.perf_counter()
        sync_saver.load(info)
        sync()
        secs = time.perf_counter() - t0
        after = float(local(probe.detach()).double().sum())
        size = du(info.path)
        loads.append(
            {
                "cold": cold,
                "s": round(secs, 2),
                "gb_s": round(size / secs / 1e9, 2),
                "restored": after == saved_sum and moved != saved_sum,
            }
        )
        print("load", loads[-1], flush=True)
    out["load"] = loads
    if device.type == "cuda":
        out["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
    result("ckpt", preset=a.preset, dir=str(root), **out, **versions())
    shutil.rmtree(root, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
