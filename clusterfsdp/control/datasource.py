"""Training data on the control plane: which sources a job names, whether they can be read,
and where their prepared (tokenized) form lives. Pure Python: no torch, numpy or datasets.

A *source* is one file or folder that `data.paths` / `eval.paths` name (globs expanded):
.txt (one document per file), .jsonl (one record per line; also gzip and zstd compressed),
.parquet, a folder written by `datasets`' `save_to_disk`, or a folder `datasets.load_dataset`
reads. Paths here are local: hub dataset ids are resolved to local snapshot folders on the
submitting host before `check` sees the spec (`check` refuses ids it still finds).

A *prepared dataset* is the token form of a list of sources, built once by
`clusterfsdp.worker.dataprep` and shared by every rank and every job that names the same data:

    <cache>/<key>/manifest.json        sources, tokenizer, token and document counts, shards
    <cache>/<key>/shards/NNNNN.tok     flat uint16/uint32 token ids
    <cache>/<key>/shards/NNNNN.doc     int64 offsets (in the shard) where documents start
    <cache>/<key>/shards/NNNNN.msk     uint8 per token, 1 = trained on (format = 'chat' only)
    <cache>/<key>/index/<id>/          samples of one seq_len / packing / split (see dataindex.py)
    <cache>/.<key>.partial/            a prepare in progress: never read by a job
    <cache>/<key>.lock                 held while one process prepares (control/lock.py)
    <cache>/fingerprints.jsonl         content hashes of source files, by file identity

The key is a hash of the *content* of the sources (a full xxh3-128 hash of every byte, so a
renamed or copied corpus is found again and any edit is noticed), the tokenizer's files, and
the options that change the tokens (format, record key, split). Hashing reads every byte once
(about as fast as the disk); to keep the start of a job fast it is remembered per file
identity (path, size, mtime, ctime, inode) in fingerprints.jsonl. ctime cannot be set by
users, so a file rewritten in place with its old mtime restored is still hashed again.
"""

from __future__ import annotations

import codecs
import dataclasses
import glob
import gzip
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

import xxhash

from . import runfolder
from . import spec as specmod
from .runroot import default_run_root

FORMAT_VERSION = 1  # of the prepared layout and of how documents become tokens
SourceKind = Literal["txt", "jsonl", "parquet", "saved_dataset", "dataset_folder"]
Compression = Literal["", "gz", "zst"]
SNIFF_BYTES = 1 << 20  # what `check` reads of a text file to judge it
SNIFF_FILES = 200  # files whose first record `check` reads (all are checked for existence)
VALIDATE_HASH_BYTES = 256 << 20  # `validate` hashes sources up to this size to find their prepared form
TOKENIZER_FILE_PREFIXES = ("tokenizer", "special_tokens_map", "vocab", "merges", "added_tokens", "chat_template")
MESSAGE_KEYS = ("role", "content")


class DataError(ValueError):
    """Data that cannot be used; the message is one line naming the key, file and line or record."""


@dataclass(frozen=True)
class Source:
    field: str  # the job.toml key that named it, e.g. "data.paths[0]"
    path: str  # absolute
    kind: SourceKind
    compression: Compression = ""

    @property
    def is_folder(self) -> bool:
        return self.kind in ("saved_dataset", "dataset_folder")

    def files(self) -> list[Path]:
        """What its content is: the file, or every non-hidden file under the folder."""
        if not self.is_folder:
            return [Path(self.path)]
        root = Path(self.path)
        return sorted(
            p
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)
        )

    def size(self) -> int:
        return sum(f.stat().st_size for f in self.files())


def cache_root(spec: specmod.JobSpec) -> Path:
    """Where prepared datasets live: data.cache_dir, or <run_root>/.cache/tokens (the run root
    rule of control/runroot.py when job.run_root is unset, as for the run folders)."""
    if spec.data.cache_dir:
        return Path(spec.data.cache_dir).expanduser()
    root = Path(spec.job.run_root).expanduser() if spec.job.run_root else default_run_root()
    return root / ".cache" / "tokens"


# ---------------------------------------------------------------- sources
def _kind(path: Path) -> tuple[SourceKind, Compression] | None:
    if path.is_dir():
        saved = (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()
        return ("saved_dataset" if saved else "dataset_folder"), ""
    name = path.name.lower()
    compression: Compression = ""
    if name.endswith(".gz"):
        name, compression = name[:-3], "gz"
    elif name.endswith(".zst"):
        name, compression = name[:-4], "zst"
    if name.endswith(".txt"):
        return "txt", compression
    if name.endswith(".jsonl"):
        return "jsonl", compression
    if name.endswith(".parquet") and not compression:
        return "parquet", ""
    return None


def _matches(pattern: str) -> list[str]:
    """What one data path names on this host: a glob's matches, or the path if it exists."""
    expanded = os.path.expanduser(pattern)
    if any(c in pattern for c in "*?["):
        return sorted(glob.glob(expanded, recursive=True))
    return [expanded] if os.path.exists(expanded) else []


def local_sources(field: str, patterns: list[str]) -> tuple[list[Source], list[str]]:
    """The sources that local paths (globs allowed) name, and one error line per path that names
    none. Every entry is a local path: hub ids must have been resolved to their local snapshot
    folder by the caller (the submitting host does that); an entry still shaped like a hub id
    is reported as such."""
    sources: list[Source] = []
    errors: list[str] = []
    for i, pattern in enumerate(patterns):
        key = f"{field}[{i}]"
        matches = _matches(pattern)
        if not matches:
            if specmod.looks_like_hub_id(pattern):
                errors.append(
                    f"{key}: {pattern!r} is not a local path; hub dataset ids are resolved to a local folder "
                    "on the submitting host at submit (give the local path here)"
                )
            else:
                errors.append(f"{key}: {pattern!r} matches no file or folder")
            continue
        for m in matches:
            path = Path(m).resolve()
            kind = _kind(path)
            if kind is None:
                errors.append(
                    f"{key}: {path}: not a data source (.txt or .jsonl, either maybe .gz or .zst; .parquet; "
                    "or a dataset folder)"
                )
                continue
            sources.append(Source(key, str(path), *kind))
    return sources, errors


def open_binary(path: str, compression: Compression, raw: IO[bytes] | None = None) -> IO[bytes]:
    """The decompressed bytes of a file (zstd across all frames); from `raw` when given (the
    caller closes it)."""
    if compression == "gz":
        return gzip.GzipFile(fileobj=raw, mode="rb") if raw is not None else gzip.open(path, "rb")  # type: ignore[return-value]
    if compression == "zst":
        import io

        import zstandard

        src = raw if raw is not None else open(path, "rb")  # noqa: SIM115 - closed with the reader
        reader = zstandard.ZstdDecompressor().stream_reader(src, read_across_frames=True, closefd=raw is None)
        return io.BufferedReader(reader, 1 << 20)  # type: ignore[arg-type]  (readline needs a buffered reader)
    return raw if raw is not None else open(path, "rb")


# ---------------------------------------------------------------- records
def utf8_error(data: bytes, where: str, first_line: int = 1, final: bool = True) -> str | None:
    """'<where>:<line>: not UTF-8 (...)' if `data` is not valid UTF-8 (an incomplete last
    character is fine unless `final`)."""
    try:
        codecs.getincrementaldecoder("utf-8")().decode(data, final=final)
        return None
    except UnicodeDecodeError as e:
        line = first_line + data.count(b"\n", 0, e.start)
        return f"{where}:{line}: not UTF-8 (byte 0x{data[e.start]:02x} at offset {e.start}); re-encode the file"


def record_key(data: specmod.DataSection) -> str:
    """The record field the job reads: the text, or the messages of a conversation."""
    return data.messages_key if data.format == "chat" else data.text_key


def record_field(data: specmod.DataSection) -> str:
    """The job.toml key that names it."""
    return "data.messages_key" if data.format == "chat" else "data.text_key"


def column_problem(where: str, data: specmod.DataSection, columns: list[str]) -> str | None:
    """The error line for a table (parquet, dataset) without the record key's column."""
    key = record_key(data)
    if key in columns:
        return None
    return f"{where}: no column {key!r} ({record_field(data)}; it has: {', '.join(columns)})"


def record_value(record: Any, data: specmod.DataSection, where: str) -> str | list[dict[str, str]]:
    """The text (format 'text') or messages (format 'chat') of one decoded record; DataError
    naming `where` (file:line or file row) and the key when the record does not have them."""
    key = record_key(data)
    if not isinstance(record, dict):
        raise DataError(f"{where}: not a JSON object")
    if key not in record:
        has = ", ".join(sorted(map(str, record))[:8]) or "none"
        raise DataError(f"{where}: no {key!r} key ({record_field(data)}; the record has: {has})")
    value = record[key]
    if data.format == "text":
        if not isinstance(value, str):
            raise DataError(f"{where}: {key!r} is {type(value).__name__}, not a string")
        return value
    return check_messages(value, key, where)


def check_messages(value: Any, key: str, where: str) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise DataError(f"{where}: {key!r} must be a non-empty list of {{role, content}} messages")
    for n, m in enumerate(value):
        if not isinstance(m, dict) or not all(isinstance(m.get(k), str) for k in MESSAGE_KEYS):
            raise DataError(f"{where}: {key}[{n}] is not an object with string 'role' and 'content'")
    if not any(m["role"] == "assistant" for m in value):
        raise DataError(f"{where}: {key!r} has no 'assistant' message: nothing to train on")
    return value


def parse_json_line(line: bytes, data: specmod.DataSection, file: str, line_no: int) -> str | list[dict[str, str]]:
    """The text or messages of one .jsonl line; DataError naming file:line otherwise."""
    try:
        record = json.loads(line.rstrip(b"\r\n"))
    except UnicodeDecodeError:
        raise DataError(utf8_error(line, file, line_no) or f"{file}:{line_no}: not UTF-8") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{file}:{line_no}: not valid JSON ({e.msg} at column {e.colno})") from None
    return record_value(record, data, f"{file}:{line_no}")


def _first_line(stream: IO[bytes], limit: int) -> tuple[int, bytes]:
    """(line number, bytes) of the first non-blank line within `limit` bytes; (0, b'') if none."""
    n = 0
    read = 0
    while read < limit:
        line = stream.readline(limit - read)
        if not line:
            break
        n += 1
        read += len(line)
        if line.strip():
            return n, line
    return 0, b""


def sniff(source: Source, data: specmod.DataSection) -> list[str]:
    """Problems in the first record of a text source (the whole file is read by prepare)."""
    where = f"{source.field}: {source.path}"
    if source.is_folder and not source.files():
        return [f"{where}: empty folder"]
    if source.kind in ("parquet", "dataset_folder"):
        return []
    if source.kind == "saved_dataset":
        return _saved_dataset_problems(source, data)
    if os.path.getsize(source.path) == 0:
        return [f"{where}: empty file"]
    try:
        with open_binary(source.path, source.compression) as f:
            if source.kind == "txt":
                head = f.read(SNIFF_BYTES)
                if not head.strip():
                    return [f"{where}: empty file (no text)"]
                problem = utf8_error(head, where, final=len(head) < SNIFF_BYTES)
                return [problem] if problem else []
            line_no, line = _first_line(f, SNIFF_BYTES)
    except (OSError, EOFError) as e:
        return [f"{where}: cannot read: {e}"]
    if not line_no:
        return [f"{where}: no records in its first {SNIFF_BYTES >> 20} MiB (empty file?)"]
    if not line.endswith(b"\n") and len(line) >= SNIFF_BYTES:
        return []  # a record longer than what we read: prepare checks it
    try:
        parse_json_line(line, data, where, line_no)
    except DataError as e:
        return [str(e)]
    return []


def _saved_dataset_problems(source: Source, data: specmod.DataSection) -> list[str]:
    """A save_to_disk folder: the split exists and its features have the record key."""
    root = Path(source.path)
    where = f"{source.field}: {source.path}"
    if (root / "dataset_dict.json").is_file():
        splits = json.loads((root / "dataset_dict.json").read_text()).get("splits", [])
        if data.split not in splits:
            return [f"{where}: no split {data.split!r} (data.split; it has: {', '.join(splits)})"]
        root = root / data.split
    try:
        features = json.loads((root / "dataset_info.json").read_text()).get("features") or {}
    except (OSError, ValueError):
        return []
    problem = column_problem(where, data, list(features)) if features else None
    return [problem] if problem else []


def tokenizer_problems(data: specmod.DataSection) -> list[str]:
    if data.tokenizer == "bytes":
        return []
    folder = Path(data.tokenizer)
    if not folder.is_dir():
        if specmod.looks_like_hub_id(data.tokenizer):
            return [f"data.tokenizer: {data.tokenizer!r} is a hub id; hub ids are resolved at submit"]
        return [f"data.tokenizer: {data.tokenizer!r} is neither 'bytes' nor a local tokenizer folder"]
    if data.format == "chat" and not has_chat_template(folder):
        return [
            f"data.tokenizer: {folder} has no chat template (tokenizer_config.json 'chat_template' or "
            "chat_template.jinja), which data.format = 'chat' needs"
        ]
    return []


def has_chat_template(folder: Path) -> bool:
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template"))
    except (OSError, ValueError):
        return False


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
            self._table = {r["id"]: r["hash"] for r in runfolder.read_jsonl(self.path) if "id" in r and "hash" in r}
        return self._table

    def get(self, path: Path) -> str | None:
        return self.table().get(self.identity(path))

    def put(self, path: Path, digest: str) -> None:
        ident = self.identity(path)
        if self.table().get(ident) != digest:
            if self.persist:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                runfolder.append_jsonl(self.path, {"id": ident, "hash": digest})
            self.table()[ident] = digest


def _digest(text: str) -> str:
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
        return parts[0] if parts else _digest("")
    base = os.path.commonpath([str(f) for f in files])
    lines = [f"{os.path.relpath(f, base)}:{d}" for f, d in zip(files, parts, strict=True)]
    return _digest("\n".join(lines))


def tokenizer_files(folder: Path) -> list[Path]:
    """The files that define a tokenizer (not the model weights that may share its folder)."""
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and (p.name.startswith(TOKENIZER_FILE_PREFIXES) or p.suffix in (".model", ".tiktoken"))
    )


@dataclass(frozen=True)
class DatasetRef:
    """One prepared dataset a job needs: 'train' (data.paths) or 'eval' (eval.paths)."""

    role: str
    sources: tuple[Source, ...]
    key: str | None  # None: not computed (validate's hashing budget ran out)
    root: Path

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
        """The manifest of the complete prepared dataset, or None if it is not prepared."""
        if self.key is None:
            return None
        try:
            return json.loads((self.folder / "manifest.json").read_text())
        except (OSError, ValueError):
            return None


def dataset_refs(spec: specmod.JobSpec, *, budget: int | None = None, progress=None) -> list[DatasetRef]:
    """The prepared datasets the job reads (train, then eval when eval.paths is set), with keys.
    With a hashing `budget` (validate) nothing is written; keys it cannot afford are None.
    Raises DataError when a path names nothing (`check` reports those first)."""
    d = spec.data
    root = cache_root(spec)
    memo = FingerprintMemo(root, persist=budget is None)
    left = [budget] if budget is not None else None
    tok_id = "bytes" if d.tokenizer == "bytes" else None
    if tok_id is None:
        tok_hash = content_hash(tokenizer_files(Path(d.tokenizer)), memo, left)
        tok_id = f"hf:{tok_hash}" if tok_hash else None
    refs = []
    for role, field, paths in (("train", "data.paths", d.paths), ("eval", "eval.paths", spec.eval.paths)):
        if not paths:
            continue
        sources, errors = local_sources(field, paths)
        if errors:
            raise DataError(errors[0])
        hashes = [content_hash(s.files(), memo, left, progress) for s in sources]
        key = None
        if tok_id is not None and None not in hashes:
            payload = {
                "v": FORMAT_VERSION,
                "sources": [[s.kind, s.compression, h] for s, h in zip(sources, hashes, strict=True)],
                "tokenizer": tok_id,
                "format": d.format,
                "key": record_key(d),
                "split": d.split if any(s.is_folder for s in sources) else "",
            }
            key = _digest(json.dumps(payload, sort_keys=True))[:24]
        refs.append(DatasetRef(role, tuple(sources), key, root))
    return refs


def index_id(spec: specmod.JobSpec, role: str) -> str:
    """Names the sample index of one (seq_len, packing, split) of a prepared dataset."""
    holdout = spec.eval.fraction if not spec.eval.paths else 0.0
    payload = {
        "v": FORMAT_VERSION,
        "seq_len": spec.data.seq_len,
        "packing": spec.packing,
        "role": role,
        "holdout": holdout,
        "seed": spec.job.seed if holdout else 0,
    }
    return _digest(json.dumps(payload, sort_keys=True))[:16]


def index_meta(ref: DatasetRef, spec: specmod.JobSpec, role: str) -> dict[str, Any] | None:
    try:
        return json.loads((ref.folder / "index" / index_id(spec, role) / "meta.json").read_text())
    except (OSError, ValueError):
        return None


def sample_roles(spec: specmod.JobSpec) -> Iterator[tuple[str, str]]:
    """(sample set, dataset role) pairs a job reads: train from the train data; eval from the
    held-out part of the train data or from eval.paths."""
    yield "train", "train"
    if spec.eval.paths:
        yield "eval", "eval"
    elif spec.eval.fraction:
        yield "eval", "train"


def batch_problem(spec: specmod.JobSpec, role: str, samples: int) -> str | None:
    """An error line when a sample set is smaller than what one step (or one evaluation) reads."""
    per_step = spec.global_batch if role == "train" else spec.world_size * spec.train.micro_batch_size
    if samples >= per_step:
        return None
    what = (
        f"one global batch ({spec.world_size} ranks x {spec.train.micro_batch_size} x {spec.train.grad_accum} "
        "accumulation)"
        if role == "train"
        else f"one evaluation batch ({spec.world_size} ranks x {spec.train.micro_batch_size})"
    )
    key = "data.paths" if role == "train" else ("eval.paths" if spec.eval.paths else "eval.fraction")
    return (
        f"{key}: the {role} data gives {samples} samples of seq_len {spec.data.seq_len} ({spec.packing} packing), "
        f"fewer than {what} = {per_step}"
    )


# ---------------------------------------------------------------- what validate and submit call
def source_problems(spec: specmod.JobSpec) -> list[str]:
    """Field-level error lines about the job's sources, cheap enough for every validate and
    submit: every path names files, none is empty, the first record of every text source (up
    to SNIFF_FILES) is UTF-8 JSON with the key, the tokenizer has a chat template for
    format = 'chat'. Prepare reads everything and reports the rest the same way."""
    if spec.data.source != "files":
        return []
    errors: list[str] = []
    sources: list[Source] = []
    for field, paths in (("data.paths", spec.data.paths), ("eval.paths", spec.eval.paths)):
        found, problems = local_sources(field, paths)
        sources += found
        errors += problems
    for s in sources[:SNIFF_FILES]:
        errors += sniff(s, spec.data)
    return errors + tokenizer_problems(spec.data)


def container_only_paths(spec: specmod.JobSpec) -> list[str]:
    """Data paths of a container job that do not exist on this host: they may exist only in the
    image, so they are checked when the job starts (prepare runs inside the container)."""
    if spec.slurm.container.kind == "none" or spec.data.source != "files":
        return []
    return [p for p in [*spec.data.paths, *spec.eval.paths] if not _matches(p)]


def check(spec: specmod.JobSpec) -> list[str]:
    """What `validate` and `submit` refuse a job for: `source_problems`, and data that is
    already prepared but smaller than one global batch (container jobs: the paths that exist
    on this host; see `container_only_paths`)."""
    inside = set(container_only_paths(spec))
    if inside:
        keep = [p for p in spec.data.paths if p not in inside]
        if not keep:  # nothing to check here: the worker checks it all
            return []
        spec = dataclasses.replace(
            spec,
            data=dataclasses.replace(spec.data, paths=keep),
            eval=dataclasses.replace(spec.eval, paths=[p for p in spec.eval.paths if p not in inside]),
        )
    errors = source_problems(spec)
    if errors:
        return errors
    return [line.removeprefix("error: ") for line in prepared_state(spec) if line.startswith("error: ")]


def unhashed_bytes(spec: specmod.JobSpec) -> int:
    """Bytes of source files whose content hash is not remembered yet (what a prepare hashes first)."""
    memo = FingerprintMemo(cache_root(spec))
    total = 0
    for field, paths in (("data.paths", spec.data.paths), ("eval.paths", spec.eval.paths)):
        for source in local_sources(field, paths)[0]:
            total += sum(f.stat().st_size for f in source.files() if memo.get(f) is None)
    return total


def prepared_state(spec: specmod.JobSpec) -> list[str]:
    """Lines for `validate`: whether each dataset is prepared (looking it up costs hashing the
    sources once, up to VALIDATE_HASH_BYTES; bigger sources are looked up by the job itself),
    and 'error: ...' lines for prepared data smaller than one batch."""
    if spec.data.source != "files":
        return []
    try:
        refs = dataset_refs(spec, budget=VALIDATE_HASH_BYTES)
    except (DataError, OSError) as e:
        return [f"error: {e}"]
    out = []
    for ref in refs:
        manifest = ref.manifest()
        if ref.key is None:
            out.append(f"{ref.role}: not looked up (sources over {VALIDATE_HASH_BYTES >> 20} MB not fingerprinted yet)")
            continue
        if manifest is None:
            out.append(
                f"{ref.role}: not prepared yet: the job prepares it at start (or `clusterfsdp data prepare`) "
                f"into {ref.folder}"
            )
            continue
        out.append(
            f"{ref.role}: prepared, {manifest['tokens']:,} tokens in {manifest['documents']:,} documents ({ref.folder})"
        )
        for role, data_role in sample_roles(spec):
            meta = index_meta(ref, spec, role) if data_role == ref.role else None
            if meta is not None and (problem := batch_problem(spec, role, int(meta["samples"]))):
                out.append(f"error: {problem}")
    return out
