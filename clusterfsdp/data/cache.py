"""The prepared-data cache: where the token form of a job's sources lives, its key, and the
content fingerprints the key is made of. Pure Python (the control plane imports it).

A *prepared dataset* is the token form of a list of sources, built once by
`clusterfsdp.data.prepare` and shared by every rank and every job that names the same data:

    <cache>/<key>/manifest.json        sources, tokenizer, token and document counts, shards
    <cache>/<key>/shards/NNNNN.tok     flat uint16/uint32 token ids
    <cache>/<key>/shards/NNNNN.doc     int64 offsets (in the shard) where documents start
    <cache>/<key>/shards/NNNNN.msk     uint8 per token, 1 = trained on (formats 'chat' and 'preference')
    <cache>/<key>/index/<id>/          samples of one seq_len / packing / split (see index.py)
    <cache>/.<key>.partial/            a prepare in progress: never read by a job
    <cache>/<key>.lock                 held while one process prepares (core/lock.py)
    <cache>/fingerprints.jsonl         content hashes of source files, by file identity

The key is a hash of the *content* of the sources (a full xxh3-128 hash of every byte, so a
renamed or copied corpus is found again and any edit is noticed), the tokenizer's files, and
the options that change the tokens (format, record key, split, and data.bad_records = 'skip',
whose skipped records are absent; not its limit, which only decides whether a prepare fails).
Hashing reads every byte once (about as fast as the disk); to keep the start of a job fast it
is remembered per file identity (path, size, mtime, ctime, inode) in fingerprints.jsonl.
ctime cannot be set by users, so a file rewritten in place with its old mtime restored is still hashed again.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from ..core import fileio
from ..core import spec as specmod
from ..core.runroot import default_run_root
from ..core.spec import badrecords
from ..core.value import value
from . import trust
from .fieldmap import FieldMap
from .kinds import local_sources
from .sources import DataError, Source

FORMAT_VERSION = 2  # of the prepared layout and of how documents become tokens (2: sealed files)
TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "vocab", "merges", "added_tokens", "chat_template")


def cache_root(spec: specmod.JobSpec) -> Path:
    """Where prepared datasets live: data.cache_dir, or <run_root>/.cache/tokens (the run root
    rule of core/runroot.py when job.run_root is unset, as for the run folders)."""
    if spec.data.cache_dir:
        return Path(spec.data.cache_dir).expanduser()
    root = Path(spec.job.run_root).expanduser() if spec.job.run_root else default_run_root()
    return root / ".cache" / "tokens"


# ---------------------------------------------------------------- fingerprints and keys
class FingerprintMemo:
    """Content hashes of files remembered by file identity, in <cache>/fingerprints.jsonl
    (append-only lines, so concurrent writers never corrupt it; the last line for an identity
    wins). With `persist=False` (validate, submit) new hashes are kept in memory only."""

    def __init__(self, root: Path, persist: bool = True):
        self.path, self.persist = root / "fingerprints.jsonl", persist
        self._table: dict[str, str] | None = None

    @staticmethod
    def identity(path: Path) -> str:
        st = path.stat()
        return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ctime_ns}|{st.st_ino}"

    def table(self) -> dict[str, str]:
        if self._table is None:
            trust.require(self.path)
            self._table = {r["id"]: r["hash"] for r in fileio.read_jsonl(self.path) if "id" in r and "hash" in r}
        return self._table

    def get(self, path: Path) -> str | None:
        return self.table().get(self.identity(path))

    def put(self, path: Path, digest: str) -> None:
        ident = self.identity(path)
        if self.table().get(ident) != digest:
            if self.persist:
                trust.mkdirs(self.path.parent)
                new = not self.path.exists()
                fileio.append_jsonl(self.path, {"id": ident, "hash": digest})
                if new:
                    trust.secure(self.path)
            self.table()[ident] = digest


def text_hash(text: str) -> str:
    return xxhash.xxh3_128(text.encode()).hexdigest()


def hash_file(path: Path, progress: Callable[[int], None] | None = None) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 23):
            h.update(chunk)
            if progress:
                progress(len(chunk))
    return h.hexdigest()


def content_hash(
    files: list[Path], memo: FingerprintMemo, budget: list[int] | None = None, progress=None
) -> str | None:
    """One hash of the files' names (relative to their common folder) and contents; None when
    files not in the memo would need more than `budget[0]` bytes of hashing."""
    parts = []
    for f in files:
        digest = memo.get(f)
        if digest is None:
            if budget is not None:
                budget[0] -= f.stat().st_size
                if budget[0] < 0:
                    return None
            digest = hash_file(f, progress)
            memo.put(f, digest)
        parts.append(digest)
    if len(files) <= 1:
        return parts[0] if parts else text_hash("")
    base = os.path.commonpath([str(f) for f in files])
    lines = [f"{os.path.relpath(f, base)}:{d}" for f, d in zip(files, parts, strict=True)]
    return text_hash("\n".join(lines))


def tokenizer_files(folder: Path) -> list[Path]:
    """The files that define a tokenizer (not the model weights that may share its folder)."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and (p.name.startswith(TOKENIZER_FILE_PREFIXES) or p.suffix in (".model", ".tiktoken"))
    )


@value(frozen=True)
class DatasetRef:
    """One prepared dataset a job needs: 'train' (data.paths) or 'eval' (eval.paths)."""

    role: str
    sources: tuple[Source, ...]
    key: str | None  # None: not computed (validate's hashing budget ran out)
    root: Path
    part: int = -1  # its entry of data.sources (a mixture's part); -1: data.paths / eval.paths

    @property
    def folder(self) -> Path:
        return self.root / str(self.key)

    @property
    def partial(self) -> Path:
        return self.root / f".{self.key}.partial"

    @property
    def lock_path(self) -> Path:
        return self.root / f"{self.key}.lock"

    def manifest(self) -> dict[str, Any] | None:
        """The manifest of the complete prepared dataset, or None if it is not prepared;
        DataError when it is not one to trust (trust.py)."""
        if self.key is None:
            return None
        trust.require(self.folder, self.folder / "manifest.json", self.folder / "shards")
        try:
            return json.loads((self.folder / "manifest.json").read_text())
        except PermissionError:
            raise DataError(
                f"{self.folder} is private to its owner (prepared from files not every user can read): "
                "set data.cache_dir to a folder of your own"
            ) from None
        except (OSError, ValueError):
            return None


@value(frozen=True)
class DatasetInput:
    """What one prepared dataset is made of, before its key: the role, the job.toml key naming
    its paths, the paths, how its records are read, and its entry of data.sources (or -1)."""

    role: str
    field: str
    paths: list[str]
    data: specmod.DataSection
    part: int = -1


def dataset_inputs(spec: specmod.JobSpec) -> list[DatasetInput]:
    """The prepared datasets a job reads, in order: the training data (data.paths, or one per
    [[data.sources]] entry), then the eval data (eval.paths)."""
    out = [DatasetInput("train", "data.paths", spec.data.paths, role_data(spec, "train"))]
    if spec.data.sources:
        out = [
            DatasetInput("train", f"data.sources[{i}].path", [s.path], part_data(spec, i), i)
            for i, s in enumerate(spec.data.sources)
        ]
    return [*out, DatasetInput("eval", "eval.paths", spec.eval.paths, role_data(spec, "eval"))]


def dataset_refs(spec: specmod.JobSpec, *, budget: int | None = None, progress=None) -> list[DatasetRef]:
    """The prepared datasets the job reads (train, or one per [[data.sources]] entry; then eval
    when eval.paths is set), with keys. With a hashing `budget` (validate) nothing is written;
    keys it cannot afford are None. Raises DataError when a path names nothing
    (`checks.problems` reports those first)."""
    d = spec.data
    root = cache_root(spec)
    memo = FingerprintMemo(root, persist=budget is None)
    left = [budget] if budget is not None else None
    tok_id = "bytes" if d.tokenizer == "bytes" else None
    if tok_id is None:
        tok_hash = content_hash(tokenizer_files(Path(d.tokenizer)), memo, left)
        tok_id = f"hf:{tok_hash}" if tok_hash else None
    refs = []
    for given in dataset_inputs(spec):
        if not given.paths:
            continue
        sources, errors = local_sources(given.field, given.paths)
        if errors:
            raise DataError(errors[0])
        hashes = [content_hash(s.files(), memo, left, progress) for s in sources]
        key = None
        if tok_id is not None and None not in hashes:
            data, fields = given.data, FieldMap.of(given.data)
            payload = {
                "v": FORMAT_VERSION,
                "sources": [[s.kind, s.compression, h] for s, h in zip(sources, hashes, strict=True)],
                "tokenizer": tok_id,
                "format": data.format,
                "key": fields.key,
                "split": data.split if any(s.is_folder for s in sources) else "",
            }
            if mapping := fields.key_payload():  # a field mapping reads other fields: other tokens
                payload["map"] = mapping
            policy = badrecords.parse(d.bad_records)
            if policy is not None and policy.skip:  # skipped records are absent (not the limit: it only fails)
                payload["bad_records"] = "skip"
            key = text_hash(json.dumps(payload, sort_keys=True))[:24]
        refs.append(DatasetRef(given.role, tuple(sources), key, root, given.part))
    return refs


def role_data(spec: specmod.JobSpec, role: str) -> specmod.DataSection:
    """The [data] section as the train or eval data is read: eval reads eval.split when set,
    and always the [data] keys, never a source's mapping."""
    if role == "eval":
        return dataclasses.replace(spec.data, split=spec.eval.split or spec.data.split, sources=[])
    return spec.data


def part_data(spec: specmod.JobSpec, part: int) -> specmod.DataSection:
    """The [data] section as one [[data.sources]] entry is read: its path, format, split and keys
    (empty ones: the [data] keys) and its field mapping (fieldmap.FieldMap.of)."""
    d, s = spec.data, spec.data.sources[part]
    return dataclasses.replace(
        d,
        paths=[s.path],
        format=s.format or d.format,
        split=s.split or d.split,
        text_key=s.text_key or d.text_key,
        messages_key=s.messages_key or d.messages_key,
        prompt_key=s.prompt_key or d.prompt_key,
        chosen_key=s.chosen_key or d.chosen_key,
        rejected_key=s.rejected_key or d.rejected_key,
        completion_key=s.completion_key or d.completion_key,
        label_key=s.label_key or d.label_key,
        sources=[s],
    )


def ref_data(spec: specmod.JobSpec, ref: DatasetRef) -> specmod.DataSection:
    """How the records of a prepared dataset are read."""
    return part_data(spec, ref.part) if ref.part >= 0 else role_data(spec, ref.role)


def same_data_problem(refs: list[DatasetRef]) -> str | None:
    """The error line for an eval set that is the training set, or one source of a mixture (the
    same prepared key)."""
    held = next((r.key for r in refs if r.role == "eval"), None)
    if held is None or held not in {r.key for r in refs if r.role == "train"}:
        return None
    return (
        f"eval.paths: the eval data is the training data (the same sources, split and format: prepared key "
        f"{held}): set eval.split (e.g. 'test' of a DatasetDict folder) or name other data"
    )


def unhashed_bytes(spec: specmod.JobSpec) -> int:
    """Bytes of source files whose content hash is not remembered yet (what a prepare hashes first)."""
    memo = FingerprintMemo(cache_root(spec))
    total = 0
    for given in dataset_inputs(spec):
        for source in local_sources(given.field, given.paths)[0]:
            total += sum(f.stat().st_size for f in source.files() if memo.get(f) is None)
    return total
