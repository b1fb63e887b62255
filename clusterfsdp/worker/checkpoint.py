"""Saving and loading sharded checkpoints with torch.distributed.checkpoint (DCP), for FSDP2
and FSDP1 alike. The folder layout (what a complete checkpoint is, where it lives) is in
`clusterfsdp.control.ckptfolder`, which the control plane reads without torch.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from ..control.ckptfolder import COMPLETE, CheckpointInfo, list_checkpoints, step_dir


class CheckpointError(RuntimeError):
    """A save or load that failed, with each failing rank's cause in one line (DCP's own
    CheckpointException is a BaseException carrying full tracebacks)."""


def _dcp_call(what: str, fn, *args, **kwargs):
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        return fn(*args, **kwargs)
    except CheckpointException as e:
        causes = sorted({f"{type(exc).__name__}: {exc}" for exc, _ in e.failures.values()})
        ranks = ",".join(map(str, sorted(e.failures)))
        raise CheckpointError(f"{what} failed on rank(s) {ranks}: {'; '.join(causes)}") from None


def _on_cuda(model) -> bool:
    return any(p.device.type == "cuda" for p in model.parameters())


def _pinned_stager():
    """A stager that keeps the host copy of the state in pinned buffers between async saves.

    Without it `dcp.async_save` copies the state into fresh pageable host memory on the caller's
    thread: 12.7 s blocked per save for a 1B model + AdamW (15.9 GB) on an H100, at 1.3-1.6 GB/s.
    With the buffers kept, later saves block 0.33 s (bench/README.md). The first save allocates
    and pins them (23 s for 15.9 GB), and they hold host RAM equal to this rank's shard of model
    and optimizer state for the rest of the run. Pinning needs CUDA, hence GPU runs only."""
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    return BlockingAsyncStager(cache_staged_state_dict=True)


class Checkpointer:
    """Saves and loads one run's checkpoints; every method is collective unless noted."""

    def __init__(
        self, root: Path, model, optimizer, rank: int, world_size: int, spec_text: str, keep_last: int, async_save: bool
    ):
        import torch.distributed as dist

        self.root, self.model, self.optimizer = root, model, optimizer
        self.rank, self.world_size, self.spec_text, self.keep_last = rank, world_size, spec_text, keep_last
        self.async_save = async_save
        self._pending: tuple[Any, Path, Path, dict] | None = None
        # Async saves coordinate over their own gloo group so they never queue behind NCCL work.
        self._pg = dist.new_group(backend="gloo") if async_save and dist.is_initialized() else None
        self._stager = _pinned_stager() if async_save and _on_cuda(model) else None
        # Whether a checkpoint loaded is decided by all ranks together (a truncated shard fails on
        # the ranks that read it), over gloo so it needs no device tensor.
        self._agree_pg = dist.new_group(backend="gloo") if dist.is_initialized() else None
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def save(self, step: int, meta: dict[str, Any], *, blocking: bool = False) -> float:
        """Save at `step`; returns the seconds training was blocked. Async unless `blocking`."""
        import torch

        t0 = time.perf_counter()
        self.wait()  # the previous async save must finish first
        final, partial = step_dir(self.root, step), self.root / f".step-{step:08d}.partial"
        if final.exists():
            return time.perf_counter() - t0
        if self.rank == 0:
            for stale in self.root.glob(".step-*.partial"):
                shutil.rmtree(stale, ignore_errors=True)
            partial.mkdir(parents=True)
        _barrier()
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        (partial / "rng").mkdir(exist_ok=True)
        torch.save(rng, partial / "rng" / f"rank{self.rank}.pt")
        meta = {**meta, "step": step, "world_size": self.world_size, "saved": time.time()}
        try:
            self._write(partial, final, meta, blocking)
        except CheckpointError as e:
            raise CheckpointError(f"{e} [{_free_space(self.root)}]") from None
        return time.perf_counter() - t0

    def _write(self, partial: Path, final: Path, meta: dict[str, Any], blocking: bool) -> None:
        import torch.distributed.checkpoint as dcp

        step = meta["step"]
        if self.async_save and not blocking:
            future = dcp.async_save(
                self._state(), checkpoint_id=str(partial), process_group=self._pg, async_stager=self._stager
            )
            self._pending = (future, partial, final, meta)
        else:
            _dcp_call(f"saving step {step}", dcp.save, self._state(), checkpoint_id=str(partial))
            self._finalize(partial, final, meta)

    def poll(self) -> None:
        """Finalize a finished async save without waiting (cheap; call every step)."""
        if self._pending is not None and self._pending[0].done():
            self.wait()

    def wait(self) -> None:
        if self._pending is None:
            return
        future, partial, final, meta = self._pending
        self._pending = None
        _dcp_call(f"saving step {meta['step']} (async)", future.result)
        self._finalize(partial, final, meta)

    def _finalize(self, partial: Path, final: Path, meta: dict[str, Any]) -> None:
        """Rank 0 marks the checkpoint complete and atomically renames it into place, then prunes."""
        if self.rank != 0:
            return
        (partial / "job.toml").write_text(self.spec_text)
        tmp = partial / f".{COMPLETE}.tmp"
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, partial / COMPLETE)
        os.replace(partial, final)
        _fsync_dir(self.root)
        for old in list_checkpoints(self.root)[: -self.keep_last]:
            shutil.rmtree(old.path, ignore_errors=True)

    def load(self, info: CheckpointInfo) -> dict[str, Any]:
        """Load model + optimizer (resharding to this world size) and this rank's RNG; returns the meta."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        _dcp_call(f"loading {info.path.name}", dcp.load, state, checkpoint_id=str(info.path))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        rng_file = info.path / "rng" / f"rank{self.rank}.pt"
        if info.meta.get("world_size") == self.world_size and rng_file.is_file():
            rng = torch.load(rng_file, weights_only=False)
            torch.set_rng_state(rng["cpu"])
            if "cuda" in rng and torch.cuda.is_available():
                torch.cuda.set_rng_state(rng["cuda"])
        return info.meta

    def load_newest(self) -> tuple[CheckpointInfo | None, dict[str, Any], list[tuple[int, str]]]:
        """Load the newest complete checkpoint that loads on every rank. Each newer one that does
        not (a truncated shard, a garbage `.metadata`) is moved to `set-aside/step-N-unreadable-T`
        by rank 0, so that it is never tried again nor counted by `keep_last`, and returned as
        (step, reason). Raises CheckpointError when checkpoints exist and none loads: the model
        may be partly overwritten by then, so training must not go on from it."""
        import torch
        import torch.distributed as dist

        failed: list[tuple[int, str]] = []
        for info in reversed(list_checkpoints(self.root)):
            reason = ""
            try:
                meta = self.load(info)
            except Exception as e:  # DCP, pickle or OS errors alike: the verdict is collective below
                reason = " ".join(f"{type(e).__name__}: {e}".split())[:300]
                meta = {}
            flag = torch.tensor([1 if reason else 0])
            if self._agree_pg is not None:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._agree_pg)
            if not flag.item():
                return info, meta, failed
            failed.append((info.step, reason or "it did not load on another rank"))
            if self.rank == 0:
                aside = self.root / "set-aside" / f"{info.path.name}-unreadable-{int(time.time())}"
                aside.parent.mkdir(exist_ok=True)
                os.replace(info.path, aside)
            _barrier()
        if failed:
            steps = ", ".join(str(step) for step, _ in failed)
            raise CheckpointError(f"no checkpoint could be loaded (steps {steps}, set aside): {failed[0][1]}")
        return None, {}, failed


def _free_space(root: Path) -> str:
    """'X MiB free on ROOT', flagged when low: DCP reports a full disk only as a serializer error."""
    free = shutil.disk_usage(root).free
    note = " - disk full?" if free < 64 * 2**20 else ""
    return f"{free / 2**20:.1f} MiB free on {root}{note}"


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
