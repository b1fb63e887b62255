"""Preparing datasets (data/prepare.py): every source kind gives the tokens the tokenizer
gives, bad input is named by file and line (or row, or key) and leaves nothing behind, an
interrupted prepare keeps its complete shards and is continued, and a second preparer waits
for the lock instead of preparing again. Real files, a real BPE tokenizer, real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from data_helpers import documents, job, make_tokenizer, write_jsonl, write_parquet, write_saved_dataset

from clusterfsdp.core import spec as S
from clusterfsdp.core.lock import FileLock
from clusterfsdp.data import cache, checks, filekind, shards
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data.sources import DataError


@pytest.fixture(scope="module")
def bpe(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "bpe")


def stream(ref: cache.DatasetRef) -> tuple[np.ndarray, np.ndarray]:
    """(all token ids, document starts) of a prepared dataset, read back from its shard files."""
    manifest = ref.manifest()
    assert manifest is not None
    tokens = np.concatenate(
        [np.fromfile(ref.folder / "shards" / f"{i:05d}.tok", manifest["dtype"]) for i in range(len(manifest["shards"]))]
    )
    assert len(tokens) == manifest["tokens"]
    return tokens, shards.document_starts(ref.folder, manifest)


def expected(tokenizer: Path, docs: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """What the tokenizer's own API gives: each document's ids, then EOS."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    ids = [tok(d)["input_ids"] + [tok.eos_token_id] for d in docs]
    starts = np.cumsum([0] + [len(i) for i in ids[:-1]])
    return np.concatenate(ids), starts


DOCS = documents(60)


def _source(kind: str, folder: Path) -> Path:
    records = [{"text": d, "id": i} for i, d in enumerate(DOCS)]
    if kind.startswith("jsonl"):
        return write_jsonl(folder / f"d.{kind}", records)
    if kind == "parquet":
        return write_parquet(folder / "d.parquet", records)
    if kind == "saved":
        return write_saved_dataset(folder / "saved", records)
    if kind == "saved-dict":
        return write_saved_dataset(folder / "saved", records, split="train")
    # a folder that datasets.load_dataset reads: two jsonl files, read in name order
    (folder / "ds").mkdir()
    write_jsonl(folder / "ds" / "a.jsonl", records[:25])
    write_jsonl(folder / "ds" / "b.jsonl", records[25:])
    return folder / "ds"


@pytest.mark.parametrize("kind", ["jsonl", "jsonl.gz", "jsonl.zst", "parquet", "saved", "saved-dict", "folder"])
def test_every_source_kind_gives_the_tokenizers_tokens(tmp_path, bpe, kind):
    spec = job(tmp_path, [_source(kind, tmp_path)], str(bpe))
    assert checks.problems(spec) == []
    (ref,) = dataprep.ensure(spec, workers=1, unit_bytes=2048)  # several shards per source
    tokens, starts = stream(ref)
    want, want_starts = expected(bpe, DOCS)
    assert np.array_equal(tokens, want) and np.array_equal(starts, want_starts)
    manifest = ref.manifest()
    assert manifest is not None and manifest["documents"] == len(DOCS) and manifest["dtype"] == "uint16"
    assert len(manifest["shards"]) > 1
    assert not ref.partial.exists()


@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_a_txt_file_is_one_document_across_shards(tmp_path, bpe, tokenizer):
    text = "".join(DOCS) * 3
    path = tmp_path / "book.txt"
    path.write_text(text)
    spec = job(tmp_path, [path], "bytes" if tokenizer == "bytes" else str(bpe))
    (ref,) = dataprep.ensure(spec, workers=1, unit_bytes=1000)
    tokens, starts = stream(ref)
    manifest = ref.manifest()
    assert manifest is not None and len(manifest["shards"]) > 5 and list(starts) == [0]
    eos = manifest["eos"]
    assert tokens[-1] == eos and eos not in tokens[:-1]
    if tokenizer == "bytes":
        assert bytes(tokens[:-1].astype(np.uint8)) == text.encode()
    else:
        from transformers import AutoTokenizer

        assert AutoTokenizer.from_pretrained(bpe).decode(tokens[:-1].tolist()) == text


def test_the_same_content_elsewhere_is_the_same_dataset_and_any_edit_is_a_new_one(tmp_path, bpe):
    a = write_jsonl(tmp_path / "a.jsonl", [{"text": d} for d in DOCS])
    (first,) = dataprep.ensure(job(tmp_path, [a], str(bpe)), workers=1)
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(a.read_bytes())
    (again,) = cache.dataset_refs(job(tmp_path, [copy], str(bpe)))
    assert again.key == first.key and again.manifest() is not None
    # same size, mtime put back: the file identity's ctime still changes, so it is hashed again
    st = os.stat(a)
    data = a.read_bytes()
    a.write_bytes(data.replace(b"the", b"THE", 1))
    os.utime(a, ns=(st.st_atime_ns, st.st_mtime_ns))
    (edited,) = cache.dataset_refs(job(tmp_path, [a], str(bpe)))
    assert edited.key != first.key and edited.manifest() is None
    # the tokenizer is part of the key too
    (other,) = cache.dataset_refs(job(tmp_path, [copy], "bytes"))
    assert other.key != first.key


def _jsonl_with_line(path: Path, records: list[dict], line: int, raw: bytes) -> Path:
    """A .jsonl of `records` whose line number `line` is replaced by `raw`."""
    lines = write_jsonl(path, records).read_bytes().split(b"\n")
    lines[line - 1] = raw
    path.write_bytes(b"\n".join(lines))
    return path


def _bad(kind: str, folder: Path) -> tuple[Path, str]:
    """A source with one defect deep inside (not in its first record) and the message it must give."""
    good = [{"text": d} for d in DOCS[:30]]
    if kind == "json":
        path = _jsonl_with_line(folder / "d.jsonl", good, 25, b'{"text": "unterminated')
        return path, f"{path}:25: not valid JSON"
    if kind == "key":
        path = write_jsonl(folder / "d.jsonl.gz", [*good[:20], {"body": "x"}, *good[20:]])
        return path, f"{path}:21: no 'text' key (data.text_key; the record has: body)"
    if kind == "utf8-jsonl":
        path = _jsonl_with_line(folder / "d.jsonl", good, 28, b'{"text": "caf\xe9"}')
        return path, f"{path}:28: not UTF-8"
    if kind == "utf8-txt":
        path = folder / "d.txt"
        lines = filekind.SNIFF_BYTES // 5 + 100  # past what validate reads
        path.write_bytes(b"line\n" * lines + b"bad \xff byte\n" + b"more\n" * 10)
        return path, f"{path}:{lines + 1}: not UTF-8"
    if kind == "null":
        path = write_parquet(folder / "d.parquet", [*good[:8], {"text": None}, *good[8:]])
        return path, f"{path} row 9: 'text' is null"
    if kind == "column":
        path = write_parquet(folder / "d.parquet", [{"body": d["text"]} for d in good])
        return path, f"{path}: no column 'text' (data.text_key; it has: body)"
    path = write_saved_dataset(folder / "saved", good, split="validation")
    return path, "no split 'train' (data.split; it has: validation, test)"


@pytest.mark.parametrize("kind", ["json", "key", "utf8-jsonl", "utf8-txt", "null", "column", "split"])
def test_bad_input_names_the_file_and_line_and_leaves_nothing(tmp_path, kind):
    path, message = _bad(kind, tmp_path)
    spec = job(tmp_path, [path], "bytes")
    early = checks.source_problems(spec)  # validate reads the first record (and a split's metadata)
    assert (early == []) if kind != "split" else (len(early) == 1 and message in early[0])
    with pytest.raises(DataError) as e:
        dataprep.ensure(spec, workers=1, unit_bytes=512 if kind != "utf8-txt" else 100_000)
    assert message in str(e.value) and str(e.value).startswith("data.paths[0]: ")
    cache = tmp_path / "cache"
    assert not [p for p in cache.iterdir() if p.is_dir() and p.name != "hf-datasets"], list(cache.iterdir())


def test_a_dataset_smaller_than_one_global_batch_is_refused(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "tiny"}] * 3)
    spec = job(tmp_path, [path], "bytes", "slurm.tasks_per_node=2", "train.grad_accum=2")
    with pytest.raises(DataError, match=r"data.paths: the train data gives 0 samples .* fewer than one global batch"):
        dataprep.ensure(spec, workers=1)


def _prepare_cli(job_file: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "clusterfsdp.data.prepare", str(job_file), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def test_an_interrupted_prepare_is_never_used_and_is_continued(tmp_path, bpe):
    """`data prepare` with a pool of 2 processes is killed (SIGKILL, whole process group) once
    some shards are complete: no prepared dataset exists; the next prepare keeps those shards
    and its result is exactly that of a prepare that was never interrupted."""
    big = write_jsonl(tmp_path / "big.jsonl", [{"text": d} for d in DOCS * 40])
    spec = job(tmp_path, [big], str(bpe))
    job_file = tmp_path / "job.toml"
    job_file.write_text(S.dumps(spec))
    (ref,) = cache.dataset_refs(spec)
    proc = _prepare_cli(job_file, "--workers", "2", "--unit-bytes", "16384")
    deadline = time.time() + 300
    while not list((ref.partial / "shards").glob("[0-9]*.json")):
        assert proc.poll() is None and time.time() < deadline, proc.communicate()[0]
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    complete = {p.stem for p in (ref.partial / "shards").glob("[0-9]*.json")}
    kept = len(complete)
    assert ref.manifest() is None and not ref.folder.exists() and kept >= 1
    written = {name: os.stat(ref.partial / "shards" / f"{name}.tok") for name in complete}
    total = -(-big.stat().st_size // 16384)
    assert kept < total, "the prepare finished before it was killed"

    again = _prepare_cli(job_file, "--workers", "1", "--unit-bytes", "16384")
    out = again.communicate(timeout=300)[0]
    assert again.returncode == 0, out
    assert f"({kept} shards kept)" in out
    for name, before in written.items():  # kept: the same files, not tokenized again
        after = os.stat(ref.folder / "shards" / f"{name}.tok")
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), name
    assert not ref.partial.exists()

    fresh = job(tmp_path / "fresh", [big], str(bpe))
    (clean,) = dataprep.ensure(fresh, workers=1, unit_bytes=16384)
    assert clean.key == ref.key and clean.folder != ref.folder
    got, want = stream(ref), stream(clean)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_a_second_preparer_waits_for_the_lock_and_uses_the_result(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in DOCS])
    spec = job(tmp_path, [path], "bytes")
    (ref,) = cache.dataset_refs(spec)
    ref.root.mkdir(parents=True, exist_ok=True)
    holder = FileLock(ref.lock_path, "prepare dataset (test)").acquire()
    lines: list[str] = []
    t = threading.Thread(target=lambda: dataprep.ensure(spec, lines.append, workers=1))
    t.start()
    deadline = time.monotonic() + 120
    while not any("waiting for the prepare that holds the lock" in line for line in lines):
        assert t.is_alive() and time.monotonic() < deadline, lines
        time.sleep(0.05)
    assert ref.manifest() is None and t.is_alive()
    holder.release()
    t.join(timeout=60)
    assert ref.manifest() is not None
    assert sum("data: preparing" in line for line in lines) == 1


def _with_bad_records(folder: Path) -> tuple[list[Path], list[str], list[str]]:
    """A .jsonl with three unreadable lines (broken JSON, a missing key, not UTF-8) and a parquet
    with a null row; the sources, the error lines the four must give (in order), and the good texts."""
    good = [d for d in DOCS[:50] if d]
    lines = [json.dumps({"text": d}).encode() for d in good[:30]]
    lines.insert(4, b'{"text": "unterminated')  # line 5
    lines.insert(11, b'{"body": "no text"}')  # line 12
    lines.insert(19, b'{"text": "caf\xe9"}')  # line 20
    jsonl = folder / "d.jsonl"
    jsonl.write_bytes(b"\n".join(lines) + b"\n")
    parquet = write_parquet(
        folder / "d.parquet", [*[{"text": d} for d in good[30:38]], {"text": None}, *[{"text": d} for d in good[38:]]]
    )
    bad = [
        f"data.paths[0]: {jsonl}:5: not valid JSON",
        f"data.paths[0]: {jsonl}:12: no 'text' key",
        f"data.paths[0]: {jsonl}:20: not UTF-8",
        f"data.paths[1]: {parquet} row 9: 'text' is null",
    ]
    return [jsonl, parquet], bad, good


def test_skipped_records_are_counted_with_their_file_and_line_and_absent(tmp_path, bpe):
    paths, bad, good = _with_bad_records(tmp_path)
    with pytest.raises(DataError, match=f"^{re.escape(bad[0])}"):  # 'error' (the default) stops at the first
        dataprep.ensure(job(tmp_path, paths, str(bpe)), workers=1, unit_bytes=512)
    spec = job(tmp_path, paths, str(bpe), "data.bad_records=skip")
    logged: list[str] = []
    (ref,) = dataprep.ensure(spec, log=logged.append, workers=1, unit_bytes=512)
    manifest = ref.manifest()
    assert manifest is not None and len(manifest["shards"]) > 2  # lines counted across units
    entry = manifest["bad_records"]
    assert (entry["skipped"], entry["records"], entry["policy"]) == (4, len(good) + 4, "skip")
    assert len(entry["first"]) == 4 and all(f.startswith(b) for f, b in zip(entry["first"], bad, strict=True))
    tokens, starts = stream(ref)  # the good records only, in order
    want_tokens, want_starts = expected(bpe, good)
    assert np.array_equal(tokens, want_tokens) and np.array_equal(starts, want_starts)
    assert f"data: train: 4 of {len(good) + 4} records skipped as unreadable" in "\n".join(logged)
    assert any(bad[0] in line for line in logged)
    # a dataset of its own: the error policy's key is another one; the limit is not in the key
    (strict,) = cache.dataset_refs(job(tmp_path, paths, str(bpe)))
    (limited,) = cache.dataset_refs(job(tmp_path, paths, str(bpe), "data.bad_records=skip:10"))
    assert strict.key != ref.key == limited.key
    # validate shows the count and the first locations
    state = checks.prepared_state(spec)
    assert f"train: 4 of {len(good) + 4} records skipped as unreadable" in state[1] and bad[0] in state[2]


@pytest.mark.parametrize(
    ("policy", "crossing"), [("skip:3", 3), ("skip:1", 1), ("skip:5%", 0), ("skip:4", None), ("skip:8%", None)]
)
def test_the_bad_records_limit_fails_the_prepare_at_the_record_that_crosses_it(tmp_path, bpe, policy, crossing):
    """4 bad records of 54: 'skip:N' fails at bad record N+1 (named by file and line) and leaves
    nothing; a share fails on the total; within the limit the dataset is prepared."""
    paths, bad, _ = _with_bad_records(tmp_path)
    spec = job(tmp_path, paths, str(bpe), f"data.bad_records={policy}")
    if crossing is None:
        (ref,) = dataprep.ensure(spec, workers=1, unit_bytes=512)
        assert ref.manifest() is not None
        return
    with pytest.raises(DataError) as e:
        dataprep.ensure(spec, workers=1, unit_bytes=512)
    assert str(e.value).startswith(bad[crossing]) and f"over data.bad_records = '{policy}'" in str(e.value)
    assert not [p for p in (tmp_path / "cache").iterdir() if p.is_dir()]


def test_a_prepared_dataset_over_a_jobs_limit_is_refused_on_reuse(tmp_path, bpe):
    paths, bad, good = _with_bad_records(tmp_path)
    dataprep.ensure(job(tmp_path, paths, str(bpe), "data.bad_records=skip"), workers=1, unit_bytes=512)
    strict = job(tmp_path, paths, str(bpe), "data.bad_records=skip:2")
    message = (
        f"data.bad_records: the prepared train data left out 4 of {len(good) + 4} records that cannot be read "
        f"(prepared with 'skip'), over 'skip:2'; the first: {bad[0]}"
    )
    with pytest.raises(DataError, match=f"^{re.escape(message)}"):
        dataprep.ensure(strict, workers=1)
    assert any(line.startswith(f"error: {message}") for line in checks.prepared_state(strict))


@pytest.mark.parametrize("value", ["skip:", "skip:x", "error:3", "skip:150%", "skip:1.5", "drop"])
def test_a_bad_records_value_that_is_not_a_policy_is_refused_at_load(tmp_path, value):
    with pytest.raises(S.SpecError, match=r"data.bad_records: must be 'error', 'skip', 'skip:N'"):
        job(tmp_path, [tmp_path / "d.jsonl"], "bytes", f"data.bad_records={value}")


def test_a_count_limit_stops_the_prepare_before_the_rest_is_tokenized(tmp_path, bpe):
    """'skip:1' with two bad lines early in the first source: the prepare fails at the second one
    as soon as its shard is written, never reaching the second source (a .txt whose bad UTF-8
    would otherwise be the error)."""
    paths, bad, _ = _with_bad_records(tmp_path)
    late = tmp_path / "z.txt"
    late.write_bytes(b"fine text\n" * 50 + b"bad \xff byte\n")
    spec = job(tmp_path, [paths[0], late], str(bpe), "data.bad_records=skip:1")
    with pytest.raises(DataError) as e:
        dataprep.ensure(spec, workers=1, unit_bytes=512)
    assert str(e.value).startswith(bad[1]) and "over data.bad_records = 'skip:1'" in str(e.value)
