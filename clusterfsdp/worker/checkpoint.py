"""Saving and loading sharded checkpoints with torch.distributed.checkpoint (DCP), for FSDP2
and FSDP1 alike. The folder layout (what a complete checkpoint is, where it lives) is in
`clusterfsdp.core.ckptfolder`, which the control plane reads without torch.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._state_dict_utils import _create_cpu_state_dict
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from ..core import ckptfolder
from ..core.ckptfolder import COMPLETE, CheckpointInfo, list_checkpoints, step_dir
from ..core.spec import CheckpointSection
from . import safeload
from .model import canonical
from .parallelize import expose_fsdp1_params


class CheckpointError(RuntimeError):
    """A save or load that failed, with each failing rank's cause in one line (DCP's own
    CheckpointException is a BaseException carrying full tracebacks)."""


def dcp_call(what: str, fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except CheckpointException as e:
        causes = sorted({f"{type(exc).__name__}: {exc}" for exc, _ in e.failures.values()})
        ranks = ",".join(map(str, sorted(e.failures)))
        raise CheckpointError(f"{what} failed on rank(s) {ranks}: {'; '.join(causes)}") from None


def _on_cuda(model) -> bool:
    return any(p.device.type == "cuda" for p in model.parameters())


class PrewarmedStager(BlockingAsyncStager):
    """An async stager whose host buffers are allocated before the first save, in a background
    thread, and kept between saves.

    `dcp.async_save` must copy the state to host memory before training may touch it again; that
    copy blocks the loop. Into fresh pageable memory it ran at 1.3-1.6 GB/s on an H100 (12.7 s
    blocked per save for a 1B model + AdamW, 15.9 GB); into buffers kept between saves and pinned,
    0.33 s (bench/README.md). Allocating and pinning those buffers takes long itself (23 s for
    15.9 GB), so it happens here, at start, beside training, instead of inside the first save.
    They hold host RAM equal to this rank's shard of model and optimizer state for the rest of the
    run (pinned on CUDA; in shared memory for process-based saving, which hands them to the saver
    process without a copy). `state` is taken on the training thread (get_state_dict may
    initialize the optimizer state); the thread runs torch's `_create_cpu_state_dict`, the
    function `BlockingAsyncStager` itself calls at its first save."""

    def __init__(self, state: dict[str, Any], pin: bool, share: bool) -> None:
        super().__init__(cache_staged_state_dict=True)
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.build_s = 0.0
        threading.Thread(target=self._build, args=(state, pin, share), name="ckpt-staging-buffers", daemon=True).start()

    def _build(self, state: dict[str, Any], pin: bool, share: bool) -> None:
        t0 = time.perf_counter()
        try:
            self.state_dict_cache = _create_cpu_state_dict(state, pin_memory=pin, share_memory=share)
        except BaseException as e:  # reported by the first save, on the training thread
            self.error = e
        finally:
            self.build_s = time.perf_counter() - t0
            self.ready.set()

    def stage(self, state_dict):
        self.ready.wait()
        if self.error is not None:
            raise CheckpointError(f"allocating the staging buffers failed: {self.error}")
        return super().stage(state_dict)


class _Pruner:
    """Deletes old checkpoints off the training thread: rank 0 renames each into `.pruning/`
    (one rename: it is gone for `list_checkpoints` and `keep_last` at once) and a background
    thread removes the tree, which takes seconds for a large checkpoint on a parallel
    filesystem. What a killed process left there is removed at the next start."""

    def __init__(self, root: Path):
        self.trash = ckptfolder.pruning_dir(root)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-prune")
        self._last = self._pool.submit(self._empty)

    def _empty(self) -> None:
        try:
            if not stat.S_ISDIR(os.lstat(self.trash).st_mode):
                return  # a link or a file is never followed (ckptfolder.claim refuses it at start)
        except FileNotFoundError:
            return
        for old in self.trash.iterdir():
            if old.is_symlink() or not old.is_dir():
                old.unlink(missing_ok=True)  # the link goes, never what it points at
            else:
                shutil.rmtree(old, ignore_errors=True)  # fd-based on Linux: never follows links inside

    def prune(self, folders: list[Path]) -> None:
        if not folders:
            return
        self.trash.mkdir(exist_ok=True)
        for folder in folders:
            os.replace(folder, self.trash / f"{folder.name}-{time.time_ns()}")
        self._last = self._pool.submit(self._empty)

    def close(self) -> None:
        """Wait until the deletions asked for are done."""
        self._last.result()
        self._pool.shutdown(wait=True)


class Checkpointer:
    """Saves and loads one run's checkpoints under `root` as its `[checkpoint]` section says
    (keep_last, async, async_mode, writer_threads); every method is collective unless noted.
    `spec_text` (the run's job.toml) is copied into every checkpoint."""

    def __init__(
        self,
        root: Path,
        model,
        optimizer,
        config: CheckpointSection,
        *,
        rank: int = 0,
        world_size: int = 1,
        spec_text: str = "",
        trainable_only: bool = False,
    ):
        problem = ckptfolder.claim(root, create=rank == 0)  # every rank, before any collective
        if problem:
            raise CheckpointError(problem)
        self.root, self.model, self.optimizer, self.config = root, model, optimizer, config
        self.trainable_only = trainable_only  # LoRA: the frozen base is not saved (loaded again from its folder)
        self.rank, self.world_size, self.spec_text = rank, world_size, spec_text
        async_save, async_mode = config.async_, config.async_mode
        self._pending: tuple[Any, Path, Path, dict, float] | None = None
        self.last_save_s = 0.0  # wall time of the last completed save, async or not (the grace check)
        # Async saves coordinate over their own gloo group so they never queue behind NCCL work.
        self._pg = _gloo_group() if async_save else None
        self._stager = (
            PrewarmedStager(self._state(), pin=_on_cuda(model), share=async_mode == "process") if async_save else None
        )
        # Whether a checkpoint loaded is decided by all ranks together (a truncated shard fails on
        # the ranks that read it), over gloo so it needs no device tensor.
        self._agree_pg = _gloo_group()
        self._pruner = _Pruner(root) if rank == 0 else None
        # Rank 0, once a checkpoint is complete, before keep_last prunes: [benchmarks] queues its
        # evaluation there (worker/benchqueue.py), holding the checkpoint first.
        self.on_complete: Callable[[int], None] | None = None

    def _state(self) -> dict[str, Any]:
        expose_fsdp1_params(self.model)  # (a NO_SHARD unit's frozen weights, as tensors since the last forward)
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer, options=self._options())
        if self.trainable_only:  # (ignore_frozen_params keeps the second name of a tied frozen weight)
            names = self.model.named_parameters(remove_duplicate=False)
            trained = {canonical(n) for n, p in names if p.requires_grad}
            model_sd = {k: v for k, v in model_sd.items() if k in trained}
        return {"model": model_sd, "optim": optim_sd}

    def _options(self):
        return StateDictOptions(ignore_frozen_params=self.trainable_only, strict=not self.trainable_only)

    def _writer(self, path: Path):
        return FileSystemWriter(str(path), thread_count=self.config.writer_threads)

    def save(self, step: int, meta: dict[str, Any], *, blocking: bool = False) -> float:
        """Save at `step`; returns the seconds training was blocked. Async unless `blocking`."""
        t0 = time.perf_counter()
        self.wait()  # the previous async save must finish first
        final, partial = step_dir(self.root, step), ckptfolder.partial_dir(self.root, step)
        if final.exists():
            return time.perf_counter() - t0
        if self.rank == 0:
            for stale in ckptfolder.partial_dirs(self.root):
                shutil.rmtree(stale, ignore_errors=True)
            partial.mkdir(parents=True)
        _barrier()
        rng = {"cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state()
        payload = io.BytesIO()
        torch.save(rng, payload)
        rng_file = ckptfolder.rng_file(partial, self.rank)
        rng_file.parent.mkdir(exist_ok=True)
        rng_file.write_bytes(payload.getvalue())
        digests = self._gather(safeload.sha256(payload.getvalue()))
        meta = {**meta, "step": step, "world_size": self.world_size, "saved": time.time()}
        meta[safeload.SHA256] = {ckptfolder.rng_name(r): d for r, d in enumerate(digests)}
        try:
            self._write(partial, final, meta, blocking, t0)
        except CheckpointError as e:
            raise CheckpointError(f"{e} [{_free_space(self.root)}]") from None
        return time.perf_counter() - t0

    def _gather(self, digest: str) -> list[str]:
        """Every rank's digest, in rank order (on every rank; over gloo: small and host-side)."""
        if self._agree_pg is None:
            return [digest]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, digest, group=self._agree_pg)
        return out

    def _write(self, partial: Path, final: Path, meta: dict[str, Any], blocking: bool, t0: float) -> None:
        step = meta["step"]
        if self.config.async_ and not blocking:
            process = self.config.async_mode == "process"
            kinds = state_dict_saver.AsyncCheckpointerType
            kind = kinds.PROCESS if process else kinds.THREAD
            future = state_dict_saver.async_save(
                self._state(),
                storage_writer=self._writer(partial),
                process_group=self._pg,
                async_checkpointer_type=kind,
                async_stager=self._stager,
            )
            self._pending = (future, partial, final, meta, t0)
        else:
            dcp_call(f"saving step {step}", state_dict_saver.save, self._state(), storage_writer=self._writer(partial))
            self._finalize(partial, final, meta, t0)

    def poll(self) -> bool:
        """Finalize a finished async save without waiting (cheap; call every step); whether one was."""
        if self._pending is not None and self._pending[0].done():
            self.wait()
            return True
        return False

    def wait(self) -> None:
        if self._pending is None:
            return
        future, partial, final, meta, t0 = self._pending
        self._pending = None
        dcp_call(f"saving step {meta['step']} (async)", future.result)
        self._finalize(partial, final, meta, t0)

    def close(self) -> None:
        """Finish the pending save and the deletions asked for (end of training)."""
        self.wait()
        if self._pruner is not None:
            self._pruner.close()

    def _finalize(self, partial: Path, final: Path, meta: dict[str, Any], t0: float) -> None:
        """Rank 0 marks the checkpoint complete and atomically renames it into place, then hands
        the checkpoints beyond keep_last to the pruner."""
        self.last_save_s = time.perf_counter() - t0
        if self.rank != 0:
            return
        (partial / ckptfolder.JOB_TOML).write_text(self.spec_text)
        records = safeload.file_records(partial, {ckptfolder.JOB_TOML: self.spec_text.encode()})
        meta = {**meta, safeload.SHA256: {**meta.get(safeload.SHA256, {}), **records[safeload.SHA256]},
                safeload.SIZES: records[safeload.SIZES]}  # fmt: skip
        tmp = partial / f".{COMPLETE}.tmp"
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, partial / COMPLETE)
        os.replace(partial, final)
        _fsync_dir(self.root)
        if self.on_complete is not None:
            self.on_complete(meta["step"])
        if self._pruner is not None:
            self._pruner.prune(ckptfolder.beyond_keep(self.root, self.config.keep_last, self.config.keep_best))

    def amend(self, info: CheckpointInfo, fields: dict[str, Any]) -> None:
        """Rank 0 adds TrainState fields to a complete checkpoint's clusterfsdp.json, replaced
        whole (the numerical guard's skipped samples, so a resume from it skips them too)."""
        if self.rank != 0:
            return
        tmp = info.path / f".{COMPLETE}.tmp"
        tmp.write_text(json.dumps({**info.meta, **fields}, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, info.path / COMPLETE)

    def load(self, info: CheckpointInfo) -> dict[str, Any]:
        """Load model + optimizer (resharding to this world size) and this rank's RNG; returns the meta."""
        state = self._state()
        safeload.check_files(info.path, info.meta)
        reader, planner = safeload.SafeReader(info.path, info.meta), safeload.SafePlanner()
        dcp_call(f"loading {info.path.name}", state_dict_loader.load, state, storage_reader=reader, planner=planner)
        set_state_dict(
            self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
            options=self._options(),
        )  # fmt: skip
        if info.meta.get("world_size") == self.world_size and ckptfolder.rng_file(info.path, self.rank).is_file():
            rng = safeload.load_rng(info.path, self.rank, info.meta)
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
                ckptfolder.set_aside(info.path, ckptfolder.UNREADABLE)
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


def _gloo_group():
    """A new gloo process group over all ranks (None without torch.distributed)."""
    if not dist.is_initialized():
        return None
    group = dist.new_group(backend="gloo")
    assert isinstance(group, dist.ProcessGroup)
    return group


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
