"""Reading a checkpoint without running what is in it, and checking that its payloads are the
ones that were written.

A run folder lives on a shared filesystem: a checkpoint can be corrupted (a bad disk, a
half-copied folder) or planted (another user with write access). Pickle runs code while it
loads, and three pickles are read on resume:
- each rank's `rng/rank<R>.pt`: loaded with `torch.load(weights_only=True)` (tensors and plain
  containers only);
- DCP's `.metadata` (plain `pickle.load` in torch's FileSystemReader): unpickled here with an
  allowlist of the classes DCP writes into it (`SafeReader`);
- the non-tensor values of the state dict (optimizer hyperparameters) that DCP stores as
  pickled bytes (`torch.load(weights_only=False)` in its DefaultLoadPlanner): loaded with
  `weights_only=True` (`SafePlanner`).
Anything else is refused with one line naming the file, and the checkpoint is set aside like
any that does not load (Checkpointer.load_newest).

Checksums (`clusterfsdp.json`'s `sha256` and `sizes`): SHA-256 of the small payloads (the rng
files, `.metadata`, the job.toml copy), and the size of every shard file. Hashing the shards
themselves would read the whole checkpoint once more on every save and load (gigabytes per
rank): their sizes catch truncation, DCP catches the rest that breaks its format, and what is
planted in them can only be tensors and plain values (above). Checkpoints written before these
were recorded load without the check.
"""

from __future__ import annotations

import enum
import hashlib
import io
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint._traverse import set_element  # what DefaultLoadPlanner.load_bytes uses
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystemReader
from torch.distributed.checkpoint.metadata import StorageMeta

from ..core import ckptfolder

SHA256, SIZES = "sha256", "sizes"  # the keys of the checksums in clusterfsdp.json


class CorruptCheckpoint(RuntimeError):
    """A checkpoint payload that is not what was written, or not plain data: one line."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _verified_bytes(checkpoint: Path, name: str, meta: dict[str, Any]) -> bytes:
    """The bytes of `checkpoint/name`, checked against the recorded SHA-256 when there is one."""
    data = (checkpoint / name).read_bytes()
    expected = meta.get(SHA256, {}).get(name)
    if expected is not None and sha256(data) != expected:
        raise CorruptCheckpoint(
            f"{name}: SHA-256 does not match the one recorded when it was saved (corrupt or replaced)"
        )
    return data


def check_files(checkpoint: Path, meta: dict[str, Any]) -> None:
    """Every shard file has the size recorded at save (cheap: one stat each)."""
    for name, size in meta.get(SIZES, {}).items():
        try:
            found = (checkpoint / name).stat().st_size
        except OSError:
            raise CorruptCheckpoint(f"{name}: missing") from None
        if found != size:
            raise CorruptCheckpoint(f"{name}: {found} bytes, {size} when it was saved (truncated or replaced)")


def file_records(checkpoint: Path, extra: dict[str, bytes]) -> dict[str, Any]:
    """What rank 0 records in clusterfsdp.json once a save is complete: SHA-256 of `.metadata`
    and of `extra` (name -> bytes written), the size of every shard file."""
    sums = {name: sha256(data) for name, data in extra.items()}
    sums[ckptfolder.DCP_METADATA] = sha256((checkpoint / ckptfolder.DCP_METADATA).read_bytes())
    sizes = {p.name: p.stat().st_size for p in sorted(checkpoint.glob("*.distcp"))}
    return {SHA256: sums, SIZES: sizes}


def load_plain(data: bytes, name: str) -> Any:
    """torch.load of tensors and plain containers only; anything else refused with one line."""
    try:
        return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
    except pickle.UnpicklingError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CorruptCheckpoint(f"{name}: refused to unpickle it (not plain tensor data): {first}") from None


def load_rng(checkpoint: Path, rank: int, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    name = ckptfolder.rng_name(rank)
    return load_plain(_verified_bytes(checkpoint, name, meta), name)


# ---------------------------------------------------------------- DCP without pickle's reach
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("torch", "Size"),
    ("pathlib", "Path"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


def _enum_member(cls: Any, name: Any) -> Any:
    """What `builtins.getattr` may do in a `.metadata` file: name a member of an enum that the
    allowlist let in. CPython 3.11.0 to 3.11.6 (Debian 12's own python3 is 3.11.2) pickle an enum
    member as `getattr(cls, name)` (3.11.7 and 3.12 went back to `cls(value)`), so DCP's
    `_MEM_FORMAT_ENCODING` members arrive that way; any other use of getattr is refused."""
    if isinstance(cls, enum.EnumMeta) and isinstance(name, str) and name in cls.__members__:
        return cls.__members__[name]
    raise pickle.UnpicklingError(f"getattr({cls!r}, {name!r}) is not allowed in a DCP .metadata file")


class _MetadataUnpickler(pickle.Unpickler):
    """Only what DCP writes into `.metadata`: its metadata classes, torch.Size and dtypes, and
    members of its enums (by value, or by name as Python 3.11.0-3.11.6 write them)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
        if module == "torch.distributed.checkpoint.metadata" or (module, name) in _METADATA_CLASSES:
            found = super().find_class(module, name)
            if module != "torch.distributed.checkpoint.metadata" or isinstance(found, type):
                return found
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in a DCP .metadata file")


class SafeReader(FileSystemReader):
    """DCP's FileSystemReader with `.metadata` checked against its SHA-256 (when recorded in
    `meta`) and unpickled with an allowlist."""

    def __init__(self, path: Path, meta: dict[str, Any] | None = None):
        super().__init__(str(path))
        self._folder, self._meta = path, meta or {}

    def read_metadata(self, *args: Any, **kwargs: Any):
        name = ckptfolder.DCP_METADATA
        data = _verified_bytes(self._folder, name, self._meta)
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as e:
            raise CorruptCheckpoint(f"{name}: not a DCP metadata file ({type(e).__name__}: {e})") from None
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    """DCP's default load planner, with the non-tensor values loaded as plain data only."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        loaded = load_plain(value.getvalue(), f"state dict entry {read_item.dest_index.fqn}")
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
