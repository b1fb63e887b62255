"""Filling a meta-built, sharded model with weights, for any `AutoModelForCausalLM` family.

Three ways, chosen by `build.build_model` (one module, a little over 500 lines: they share the unit
walk, the staging for FSDP1 and the collective verdict):

- **pretrained**: transformers' own loader (`_load_pretrained_model` + `_finalize_model_loading`,
  the tail of `from_pretrained`) runs on the FSDP2-sharded model. It applies the family's key
  renames and weight fusions (`get_model_conversion_mapping`, taken before sharding because it is
  looked up by class name), reads only this rank's slice of every tensor (safetensors `get_slice`),
  computes non-persistent buffers and re-ties embeddings. No rank ever holds the whole model.
  FSDP1 flattens parameters, which that loader cannot fill: a second copy of the model is sharded
  with FSDP2 and loaded as above, then FSDP1's `param_init_fn` gathers it one unit (decoder layer)
  at a time, just before FSDP1 flattens and shards that unit. Either way the verdict is
  collective: a weight the files lack, a shape that does not match or a tensor left unset stops
  every rank with one line.
- **init** (random): each unit (a decoder layer, or the rest of the model) is initialized by the
  family's own `_init_weights`, on full-size temporaries generated from a seed derived from
  (job seed, unit name); each rank keeps its shard. The weights are the same for every world size
  and both FSDP versions. Under FSDP1 this happens in `param_init_fn`, one unit at a time.
- **buffers** (a checkpoint follows): parameters are only materialized; non-persistent buffers
  (rotary tables, Gemma's embed_scale, masks) are computed, as in both modes above.

Pinned to transformers 5.23 (the loader tail is private API); tests/test_hf_families.py compares
logits against `AutoModelForCausalLM.from_pretrained` for every tested family and guards it.
"""

from __future__ import annotations

import ctypes
import os
import re
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Shard, distribute_tensor
from transformers import initialization
from transformers.conversion_mapping import get_checkpoint_conversion_mapping, get_model_conversion_mapping
from transformers.core_model_loading import (
    Chunk,
    Concatenate,
    Interleave,
    MergeModulelist,
    Split,
    Transpose,
    WeightConverter,
)
from transformers.modeling_utils import LoadStateDictConfig, PreTrainedModel
from transformers.utils import logging as hf_logging

from ..core.modelsource import weight_files
from .model import ModelError, canonical, decoder_layers

Mode = Literal["pretrained", "init", "buffers"]


@dataclass(frozen=True)
class Unit:
    """What is initialized together under one seed: a decoder layer, or the model without its layers."""

    name: str  # canonical module name ("" for the rest of the model)
    module: nn.Module
    skip: frozenset[int] = frozenset()  # ids of decoder layers left out (the root unit)


@dataclass
class Plan:
    """Everything taken from the unsharded meta model before sharding changes it."""

    model_type: str
    units: list[Unit]
    weight_mapping: list = field(default_factory=list)
    dtype_plan: dict = field(default_factory=dict)
    touched: dict[str, set[int]] = field(default_factory=dict)  # param name -> dims a weight conversion works along
    merged: dict[str, set[int]] = field(default_factory=dict)  # param name -> dims experts are stacked along


def fill_caches() -> None:
    """Build transformers' checkpoint conversion table now (its module-level cache: about 1,000
    weight converters and 870 compiled patterns), which `plan` would build on first use in every
    rank (about 0.08 s of CPU each, the collections it triggers included: bench/forkedrank_bench.py).
    A warm launcher calls this with its imports (worker/warmstart.py), so the ranks it forks find
    it built. The table is the same code's whatever the model; each lookup returns a copy of its
    entry."""
    get_checkpoint_conversion_mapping("llama")


def plan(model: Any, dtype: torch.dtype) -> Plan:
    """`model`: the transformers model on the meta device, before sharding."""
    layers = decoder_layers(model)
    names = {id(m): canonical(n) for n, m in model.named_modules()}
    units = [Unit(names[id(layer)], layer) for layer in layers]
    units.append(Unit("", model, frozenset(id(layer) for layer in layers)))
    mapping = list(get_model_conversion_mapping(model))
    out = Plan(model.config.model_type, units, mapping, model._get_dtype_plan(dtype))
    _conversion_dims(model, mapping, out)
    return out


def _conversion_dims(model: nn.Module, mapping: list, out: Plan) -> None:
    """Which dims of which parameters a weight conversion concatenates, splits or stacks along.

    Reading shard by shard is exact only when a parameter is not sharded along such a dim
    (each source tensor is sliced in the target's coordinates, then the pieces are joined):
    Shard(1) of a fused [experts, 2·I, H] gate_up_proj would give rank r [gate_r; up_r], not
    rows r. Stacking experts (MergeModulelist) is the exception: ranks skip experts they do not own."""
    for conv in mapping:
        if not isinstance(conv, WeightConverter):
            continue
        patterns = [re.compile(re.escape(t).replace(r"\*", r"\d+")) for t in conv.target_patterns]
        touched: set[int] = set()
        merged: set[int] = set()
        for op in conv.operations:
            before_merge = not merged
            if isinstance(op, MergeModulelist):
                merged.add(op.dim)
            elif isinstance(op, (Concatenate, Chunk, Split, Interleave)):
                touched |= (
                    {op.dim, op.dim + 1}
                    if before_merge and any(isinstance(o, MergeModulelist) for o in conv.operations)
                    else {op.dim}
                )
            elif isinstance(op, Transpose):
                touched |= {op.dim0, op.dim1}
            else:  # an operation we do not know: no dim is safe
                touched |= set(range(8))
        for name, _ in model.named_parameters():
            if any(p.search(name) for p in patterns):
                out.touched.setdefault(name, set()).update(touched)
                out.merged.setdefault(name, set()).update(merged)


def shard_dims(model: nn.Module, p: Plan, shard_size: int) -> dict[nn.Parameter, int]:
    """The dim FSDP2 shards each parameter along, where it is not the default 0 (see
    `_conversion_dims`); raises ModelError for a parameter no dim of which can be sharded exactly."""
    out: dict[nn.Parameter, int] = {}
    if shard_size <= 1:
        return out
    for name, param in model.named_parameters():
        touched, merged = p.touched.get(name, set()), p.merged.get(name, set())
        if not touched and not merged:
            continue
        for dim, size in enumerate(param.shape):
            if dim in touched:
                continue
            if dim in merged:  # every rank must own at least one expert (an empty stack crashes the loader)
                if -(-size // shard_size) * (shard_size - 1) < size:
                    break
                continue
            if dim == 0 or size % shard_size == 0:  # FSDP2 shards other dims than 0 only evenly
                break
        else:
            raise ModelError(
                f"model type {p.model_type!r}: {name} {tuple(param.shape)} cannot be sharded over {shard_size} ranks "
                f"exactly (its checkpoint tensors are joined along dims {sorted(touched)}, and no other dim divides "
                f"evenly or gives every rank an expert); use a shard group size that divides {tuple(param.shape)}"
            )
        if dim:
            out[param] = dim
    return out


# ---------------------------------------------------------------- the family's own init
def _owners(model: nn.Module) -> dict[int, Any]:
    """Module id -> the innermost transformers PreTrainedModel containing it (whose _init_weights applies)."""
    owners: dict[int, Any] = {}

    def visit(module: nn.Module, owner: nn.Module) -> None:
        owner = module if isinstance(module, PreTrainedModel) else owner
        owners[id(module)] = owner
        for child in module.children():
            visit(child, owner)

    visit(model, model)
    return owners


def _unwrap(module: nn.Module) -> nn.Module:
    """The module inside activation-checkpointing and FSDP1 wrappers."""
    while True:
        inner = getattr(module, "_checkpoint_wrapped_module", None) or getattr(module, "_fsdp_wrapped_module", None)
        if inner is None:
            return module
        module = inner


def _post_order(module: nn.Module, skip: frozenset[int]) -> Iterator[nn.Module]:
    """Children before parents, like transformers' `smart_apply`, leaving out skipped subtrees."""
    for child in module.children():
        if id(child) not in skip and id(_unwrap(child)) not in skip:
            yield from _post_order(child, skip)
    yield module


def _run_init(modules: list[nn.Module], owners: dict[int, Any]) -> None:
    """The family's `_init_weights` on each module (it skips tensors flagged `_is_hf_initialized`)."""
    with initialization.guard_torch_init_functions():
        for m in modules:
            owner = owners.get(id(m))
            if owner is not None:
                owner._init_weights(m)


def unit_seed(seed: int, name: str) -> int:
    """The seed of one unit's init: the same on every rank and for every world size."""
    return (seed * 2_147_483_647 + zlib.crc32(name.encode())) % 2**63


def _float_buffers(modules: list[nn.Module]) -> Iterator[tuple[nn.Module, str, torch.Tensor]]:
    for m in modules:
        for key, buf in m._buffers.items():
            if buf is not None and buf.is_floating_point():
                yield m, key, buf


@torch.no_grad()
def init_unit(unit: Unit, owners: dict[int, Any], seed: int, device: torch.device, *, keep: bool) -> None:
    """Initialize one unit on full-size tensors, generated from (seed, unit name) on `device`.

    keep=True (FSDP1's param_init_fn, before flattening): the full tensors replace the meta
    parameters. keep=False (FSDP2, after to_empty): each sharded parameter takes its local shard
    of the full tensor. Every float tensor starts as NaN, so one that the
    family's init leaves unset is an error rather than garbage."""
    modules = list(_post_order(unit.module, unit.skip))
    swapped: list[tuple[nn.Module, str, nn.Parameter]] = []
    full: dict[int, nn.Parameter] = {}
    for m in modules:
        for key, param in m._parameters.items():
            if param is None:
                continue
            if id(param) not in full:  # tied weights: one tensor for every occurrence
                t = torch.empty(param.shape, dtype=param.dtype, device=device)
                full[id(param)] = nn.Parameter(
                    t.fill_(float("nan")) if t.is_floating_point() else t, param.requires_grad
                )
            swapped.append((m, key, param))
            m._parameters[key] = full[id(param)]
        for key, buf in m._buffers.items():
            if buf is not None and buf.is_meta:
                m._buffers[key] = torch.empty_like(buf, device=device)
    for _, _, buf in _float_buffers(modules):
        buf.fill_(float("nan"))
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(unit_seed(seed, unit.name))
        _run_init(modules, owners)
    unset = [
        f"{unit.name}.{key}".lstrip(".")
        for m, key, t in _all_tensors(modules)
        if t.is_floating_point() and t.isnan().any()
    ]
    if unset:
        model_type = getattr(getattr(owners.get(id(unit.module)), "config", None), "model_type", "?")
        raise ModelError(f"model type {model_type!r}: its _init_weights leaves {', '.join(unset[:4])} unset")
    if not keep:
        take_shards(swapped, full)


def take_shards(swapped: Sequence[tuple[nn.Module, str, nn.Parameter]], full: Mapping[int, torch.Tensor]) -> None:
    """Put each (sharded) parameter back in its module, holding its local shard of the full-size
    tensor it was initialized on (`full`, by the parameter's id)."""
    for m, key, param in swapped:
        m._parameters[key] = param
        value = full[id(param)].detach()
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(value, param.device_mesh, param.placements, src_data_rank=None))
        else:
            param.copy_(value)


def _all_tensors(modules: list[nn.Module]) -> Iterator[tuple[nn.Module, str, torch.Tensor]]:
    for m in modules:
        for key, t in [*m._parameters.items(), *m._buffers.items()]:
            if t is not None:
                yield m, key, t


@torch.no_grad()
def compute_buffers(model: nn.Module) -> None:
    """Compute non-persistent buffers (rotary tables, embed scales, masks) of a model whose
    parameters are materialized: flag every parameter and persistent buffer as set, then run the
    family's init, which skips flagged tensors."""
    _compute_buffers(list(_post_order(model, frozenset())), _owners(model))


def _compute_buffers(modules: list[nn.Module], owners: dict[int, Any]) -> None:
    for m in modules:  # (not state_dict(): under FSDP1 that gathers the whole model)
        for p in m._parameters.values():
            if p is not None:
                p._is_hf_initialized = True  # type: ignore[attr-defined]
        for key, b in m._buffers.items():
            if b is not None and key not in m._non_persistent_buffers_set:
                b._is_hf_initialized = True  # type: ignore[attr-defined]
    _run_init(modules, owners)


# ---------------------------------------------------------------- FSDP1: one unit at a time
def release_host_memory() -> None:
    """Return freed heap memory to the OS (glibc keeps freed blocks of mid-size tensors otherwise,
    and a CPU run would carry every unit's unsharded copy in its RSS)."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


class Fsdp1Materializer:
    """FSDP1's `param_init_fn`. FSDP1 calls it for every module of a unit it is about to flatten
    and shard, the unit's root first; that first call materializes the whole unit and fills it:
    random init, or the unit's weights gathered from `source` (a copy of the model sharded over
    all ranks as DTensors, loaded by `load_pretrained`), then its non-persistent buffers. A rank
    never holds more than one unit unsharded; each gathered unit is dropped from `source`."""

    def __init__(self, model: nn.Module, p: Plan, mode: Mode, seed: int, device: torch.device, source=None):
        self.units = {id(u.module): u for u in p.units}
        self.owners = _owners(model)
        self.names = {id(m): canonical(n) for n, m in model.named_modules()}
        self.mode, self.seed, self.device, self.source = mode, seed, device, source

    @torch.no_grad()
    def __call__(self, module: nn.Module) -> None:
        unit = self.units.get(id(module))
        if unit is not None and self.mode == "init":
            init_unit(unit, self.owners, self.seed, self.device, keep=True)
            return
        modules = list(_post_order(unit.module, unit.skip)) if unit is not None else [module]
        tensors = self._materialize(modules)
        if self.source is not None:
            self._gather(tensors)
        if unit is not None:
            _compute_buffers(modules, self.owners)
        if self.device.type == "cpu":
            release_host_memory()  # FSDP1 has freed the previous unit's unsharded copy: give it back

    def _materialize(self, modules: list[nn.Module]) -> dict[int, tuple[torch.Tensor, list[str]]]:
        """Empty full-size tensors on the device for every meta parameter and buffer; returns
        id -> (tensor, its names), one entry per tensor (tied weights share one)."""
        out: dict[int, tuple[torch.Tensor, list[str]]] = {}
        for m in modules:
            stores: list[tuple[dict[str, Any], bool]] = [(m._parameters, True), (m._buffers, False)]
            for store, persistent in stores:
                for key, t in list(store.items()):
                    if t is None or not t.is_meta:
                        continue
                    if id(t) not in out:
                        new = torch.empty_like(t, device=self.device)
                        if store is m._parameters:
                            new = nn.Parameter(new, t.requires_grad)
                        out[id(t)] = (new, [])
                    store[key] = out[id(t)][0]
                    if persistent or key not in m._non_persistent_buffers_set:
                        out[id(t)][1].append(f"{self.names[id(m)]}.{key}".lstrip("."))
        return out

    def _gather(self, tensors: dict[int, tuple[torch.Tensor, list[str]]]) -> None:
        """Copy each tensor from `source` (all-gathering its shards; every rank walks the same
        tensors in the same order) and drop it there."""
        source = self.source
        assert source is not None
        for tensor, names in tensors.values():
            if not names:
                continue  # a non-persistent buffer: computed, not loaded
            owner, _, key = names[0].rpartition(".")
            value = getattr(source.get_submodule(owner), key)
            tensor.copy_(value.full_tensor() if isinstance(value, DTensor) else value)
            for name in names:
                owner, _, key = name.rpartition(".")
                module = source.get_submodule(owner)
                store = module._parameters if key in module._parameters else module._buffers
                store[key] = None


# ---------------------------------------------------------------- pretrained
def _quiet_transformers(rank: int) -> None:
    """One loading report (rank 0), no per-rank progress bars; accelerate's FSDP switches off (they
    make ranks other than 0 skip loading, expecting a broadcast this code does not do)."""
    hf_logging.disable_progress_bar()
    if rank != 0:
        hf_logging.set_verbosity_error()
    for key in ("ACCELERATE_USE_FSDP", "FSDP_CPU_RAM_EFFICIENT_LOADING"):
        os.environ.pop(key, None)


def load_pretrained(model: nn.Module, folder: Path, p: Plan, device: torch.device | str, dtype: torch.dtype) -> None:
    """transformers' from_pretrained tail on `model`: on an FSDP2 model every rank reads only its
    own slices of the files. Raises ModelError for anything short of an exact load."""
    files = weight_files(folder)
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(
            f"model.name_or_path: {folder} has no weights or lacks shards (moved or deleted since submit?)"
        )
    config = LoadStateDictConfig(
        pretrained_model_name_or_path=str(folder),
        device_map={"": device},
        dtype=dtype,
        dtype_plan=p.dtype_plan,
        weight_mapping=p.weight_mapping,
    )
    try:
        info, _ = PreTrainedModel._load_pretrained_model(model, None, [str(f) for f in files], config)  # type: ignore[arg-type]
        info = PreTrainedModel._finalize_model_loading(model, config, info)
    except (RuntimeError, ValueError, KeyError) as e:
        raise ModelError(
            f"model type {p.model_type!r}: loading {folder} failed: {' '.join(str(e).split())[:400]}"
        ) from None
    _own_storage(model)
    if info.missing_keys:
        missing = sorted(info.missing_keys)
        raise ModelError(
            f"model type {p.model_type!r}: {folder} lacks {len(missing)} weight(s) the model has "
            f"({', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}): this checkpoint does not match the "
            "config, or transformers cannot map this family's files"
        )


def _own_storage(model: nn.Module) -> None:
    """Give every local shard a storage of its own. transformers slices a tensor it read whole
    and moves the slice with `.to(device, dtype)`, which copies nothing when both are already
    right (a CPU run, the CPU-offload load of a GPU run): each rank then kept every whole
    weight alive behind its shard (the memory of an unsharded model), and the shard's storage
    could not be deep-copied (the async checkpoint's staging buffers failed on every rank but
    the first: issue 40's cross product)."""
    with torch.no_grad():
        for param in model.parameters():
            if not isinstance(param, DTensor):
                continue
            local = param._local_tensor
            if local.untyped_storage().nbytes() > local.numel() * local.element_size():
                param._local_tensor = local.clone()  # FSDP2 re-reads it at its lazy init (reset_sharded_param)


def staged_source(
    build: Callable[[], nn.Module], folder: Path, p: Plan, device: torch.device, dtype: torch.dtype
) -> nn.Module:
    """For FSDP1: a second copy of the model, sharded over all ranks with FSDP2 on a 1-D mesh and
    loaded like an FSDP2 model (every rank reads only its slices); FSDP1 gathers it unit by unit."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    staging = build()
    dims = shard_dims(staging, p, world)
    fully_shard(
        staging,
        mesh=init_device_mesh(device.type, (world,)),
        shard_placement_fn=lambda param: Shard(dims.get(param, 0)),
    )
    error = None
    try:
        load_pretrained(staging, folder, p, device, dtype)
    except (ModelError, FileNotFoundError) as e:
        error = e
    agree(error)
    return staging


def agree(error: BaseException | None) -> None:
    """Collective: if any rank failed, every rank raises that rank's error (none waits in a
    collective that will never come)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        if error is not None:
            raise error
        return
    found: list = [None] * dist.get_world_size()
    dist.all_gather_object(found, None if error is None else (type(error).__name__, str(error)))
    if error is not None:
        raise error
    first = next(((r, f) for r, f in enumerate(found) if f is not None), None)
    if first is not None:
        rank, (kind, message) = first
        raise (FileNotFoundError if kind == "FileNotFoundError" else ModelError)(f"{message} (on rank {rank})")


# ---------------------------------------------------------------- the entry point
@dataclass
class Filler:
    """Fills a sharded model's parameters and buffers one of the three ways (see the module doc)."""

    plan: Plan
    mode: Mode
    seed: int
    device: torch.device
    folder: Path | None = None
    dtype: torch.dtype = torch.float32

    def fsdp2(self, model: nn.Module, offload: bool) -> None:
        """Fill an FSDP2 (or unsharded) model."""
        _quiet_transformers(dist.get_rank() if dist.is_initialized() else 0)
        if self.mode == "pretrained":
            assert self.folder is not None
            error = None
            try:
                load_pretrained(
                    model, self.folder, self.plan, torch.device("cpu") if offload else self.device, self.dtype
                )
            except (ModelError, FileNotFoundError) as e:
                error = e
            agree(error)
        else:
            model.to_empty(device="cpu" if offload else self.device)
            if self.mode == "init":
                owners = _owners(model)
                for unit in self.plan.units:
                    init_unit(unit, owners, self.seed, self.device, keep=False)
            else:
                compute_buffers(model)
        if offload:  # CPU offload moves parameters to the GPU for compute, never buffers
            for m in model.modules():
                for key, b in m._buffers.items():
                    if b is not None:
                        m._buffers[key] = b.to(self.device)
        check_materialized(model, self.plan.model_type)

    def fsdp1_init_fn(self, model: nn.Module, build: Callable[[], nn.Module]) -> Fsdp1Materializer:
        """FSDP1's param_init_fn (for pretrained weights, after loading the sharded staging copy)."""
        source = None
        if self.mode == "pretrained":
            assert self.folder is not None
            _quiet_transformers(dist.get_rank() if dist.is_initialized() else 0)
            source = staged_source(build, self.folder, self.plan, self.device, self.dtype)
        return Fsdp1Materializer(model, self.plan, self.mode, self.seed, self.device, source)


def check_materialized(model: nn.Module, model_type: str) -> None:
    """No parameter or buffer may be left on the meta device (a key nothing filled)."""
    left = [
        n
        for n, t in [*model.named_parameters(), *model.named_buffers()]
        if (t.to_local() if isinstance(t, DTensor) else t).is_meta
    ]
    if left:
        raise ModelError(f"model type {model_type!r}: {len(left)} tensor(s) never set ({', '.join(left[:3])})")
