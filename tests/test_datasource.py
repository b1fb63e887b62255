"""Data checks before anything is queued (data/checks.py through `clusterfsdp validate`,
`submit` and `data prepare`): exit 2 with the key, file and line; the prepared state shown;
eval results shown by `status`, the TUI run view and the notebook progress."""

from __future__ import annotations

import gzip
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from data_helpers import documents, write_jsonl

from clusterfsdp.core import fileio, runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Executor
from clusterfsdp.data import linefiles


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "clusterfsdp.cli", *args], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def job_file(tmp: Path, paths: list[str], *lines: str, data: str = "") -> Path:
    """A 2-rank job reading `paths`; `data` adds lines to [data], `lines` add sections."""
    path = tmp / "job.toml"
    path.write_text(
        f'[job]\nrun_root = "runs"\n[slurm]\ntasks_per_node = 2\n[data]\nsource = "files"\n'
        f"paths = {json.dumps(paths)}\nseq_len = 32\n{data}\n[train]\nmicro_batch_size = 2\n" + "\n".join(lines)
    )
    return path


def test_validate_names_every_bad_source_and_exits_2(tmp_path):
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "broken.jsonl").write_text('\n{"text": "a"\n')
    write_jsonl(tmp_path / "nokey.jsonl.gz", [{"body": "x", "id": 1}])
    (tmp_path / "latin1.txt").write_bytes("first line\ncaf\xe9\n".encode("latin-1"))
    (tmp_path / "notes.csv").write_text("text\nhello\n")
    (tmp_path / "blank.jsonl.gz").write_bytes(gzip.compress(b"\n\n"))
    (tmp_path / "nothing-here").mkdir()
    paths = ["empty.jsonl", "broken.jsonl", "nokey.jsonl.gz", "latin1.txt", "nothing/*.jsonl", "someorg/somedata"]
    r = cli("validate", str(job_file(tmp_path, [*paths, "notes.csv", "blank.jsonl.gz", "nothing-here"])))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    errors = r.stderr.splitlines()
    expected = [
        f"error: data.paths[4]: '{tmp_path}/nothing/*.jsonl' matches no file or folder",
        "error: data.paths[5]: 'someorg/somedata' is not a local path; hub dataset ids are resolved to a local folder "
        "on the submitting host at submit (give the local path here)",
        f"error: data.paths[6]: {tmp_path}/notes.csv: not a data source (.txt or .jsonl, either maybe .gz or .zst; "
        ".parquet; or a dataset folder)",
        f"error: data.paths[0]: {tmp_path}/empty.jsonl: empty file",
        f"error: data.paths[1]: {tmp_path}/broken.jsonl:2: not valid JSON (Expecting ',' delimiter at column 13)",
        f"error: data.paths[2]: {tmp_path}/nokey.jsonl.gz:1: no 'text' key (data.text_key; the record has: body, id)",
        f"error: data.paths[3]: {tmp_path}/latin1.txt:2: not UTF-8 (byte 0xe9 at offset 14); re-encode the file",
        f"error: data.paths[7]: {tmp_path}/blank.jsonl.gz: no records in its first 1 MiB (empty file?)",
        f"error: data.paths[8]: {tmp_path}/nothing-here: empty folder",
    ]
    assert errors == expected, r.stderr


def test_chat_and_eval_fields_are_checked_with_the_spec(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": "x"}])
    r = cli(
        "validate",
        str(job_file(tmp_path, [str(path)], "[eval]", "fraction = 0.1", f'paths = ["{path}"]', data='format = "chat"')),
    )
    assert r.returncode == 2
    assert (
        "job.toml: data.format: 'chat' needs a tokenizer with a chat template; data.tokenizer = 'bytes' has none"
        in (r.stderr)
    )
    assert "eval.paths: give eval.paths or eval.fraction, not both" in r.stderr
    r = cli("validate", str(job_file(tmp_path, [str(path)], "[eval]", "every_steps = 5")))
    assert r.returncode == 2 and "eval.every_steps: set eval.fraction or eval.paths" in r.stderr


def test_prepare_then_validate_knows_the_data_and_refuses_a_batch_it_cannot_fill(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in documents(40)])
    job = job_file(tmp_path, [str(path)], "[eval]", "fraction = 0.25")
    r = cli("validate", str(job))
    assert r.returncode == 0 and "prepared   train: not prepared yet: the job prepares it at start" in r.stdout
    assert "train      100 steps x 4 samples" in r.stdout and "text, concat packing" in r.stdout
    r = cli("data", "prepare", str(job), "--workers", "1")
    assert r.returncode == 0, r.stderr
    assert "data: train samples:" in r.stdout and "data: eval samples:" in r.stdout
    r = cli("validate", str(job))
    assert r.returncode == 0 and "prepared   train: prepared, " in r.stdout and " documents (" in r.stdout
    r = cli("validate", str(job), "--set", "train.micro_batch_size=500")
    assert r.returncode == 2 and "fewer than one global batch (2 ranks x 500 x 1 accumulation) = 1000" in r.stderr


def test_data_prepare_names_a_bad_line_deep_in_the_file_and_submit_refuses_bad_data(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"text": d} for d in documents(30)])
    lines = path.read_text().splitlines()
    lines[20] = lines[20][:-1]
    path.write_text("\n".join(lines) + "\n")
    job = job_file(tmp_path, [str(path)])
    r = cli("data", "prepare", str(job), "--workers", "1")
    assert r.returncode == 2 and r.stderr.startswith(f"error: data.paths[0]: {path}:21: not valid JSON"), r.stderr
    other = tmp_path / "other"
    other.mkdir()
    r = cli("submit", str(job_file(other, [str(other / "missing.jsonl")])), "--executor", "local", cwd=other)
    assert r.returncode == 2 and "data.paths[0]: " in r.stderr and "matches no file" in r.stderr
    assert not (other / "runs").exists()


def _run_with_eval(tmp_path: Path) -> runfolder.RunFolder:
    run = runfolder.create_run(S.loads(f'[job]\nrun_root = "{tmp_path}"\n'), Executor.LOCAL)
    run.add_attempt("1", Executor.LOCAL, "submit")
    base = {"lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 10.0, "time": time.time(), "mem_peak_gb": 0.1}
    for step in (10, 20, 30):
        row = {"step": step, "loss": 3.0 - step / 100, **base}
        if step == 20:
            row.update(eval_loss=1.25, eval_ppl=3.49)
        fileio.append_jsonl(run.metrics_file, row)
    return run


def test_eval_loss_is_shown_by_status_the_tui_and_the_notebook(tmp_path):
    from clusterfsdp.notebook.stepdisplay import StepDisplay
    from clusterfsdp.tui.metrics_tail import MetricsTail

    run = _run_with_eval(tmp_path)
    r = cli("status", str(run.path))
    assert "eval       step 20: eval_loss 1.2500, perplexity 3.49" in r.stdout, r.stdout
    tail = MetricsTail(run.metrics_file)
    tail.read_new()
    assert tail.snapshot().series("eval_loss") == ([20], [1.25])  # the run screen's chart draws this series
    progress = StepDisplay("job", 30, enabled=False)
    for row in run.metrics():
        progress.update(row)
    assert "loss 2.7000 eval_loss 1.2500" in progress._data()["text/plain"]


def test_a_huge_perplexity_is_written_in_scientific_notation(tmp_path):
    """An untrained or diverged model's exp(eval_loss) has 19 digits that mean nothing: status and
    the job's log write it like 8.61e+18."""
    from clusterfsdp.worker.metrics import format_row

    run = runfolder.create_run(S.loads(f'[job]\nrun_root = "{tmp_path}"\n'), Executor.LOCAL)
    run.add_attempt("1", Executor.LOCAL, "submit")
    row = {"step": 10, "loss": 43.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 10.0, "time": time.time(),
           "mem_peak_gb": 0.1, "eval_loss": 43.6, "eval_ppl": math.exp(43.6)}  # fmt: skip
    fileio.append_jsonl(run.metrics_file, row)
    r = cli("status", str(run.path))
    assert "eval       step 10: eval_loss 43.6000, perplexity 8.61e+18" in r.stdout, r.stdout
    assert " eval_loss 43.6000 eval_ppl 8.61e+18 lr " in format_row(row, 10)
    assert " eval_ppl 3.49 " in format_row({**row, "eval_loss": 1.25, "eval_ppl": 3.49}, 10)


def test_a_json_line_cut_inside_a_string_is_named_once(tmp_path):
    from clusterfsdp.data.fieldmap import FieldMap
    from clusterfsdp.data.formats import parse_json_line
    from clusterfsdp.data.sources import DataError

    fields = FieldMap.of(S.DataSection())
    with pytest.raises(DataError) as e:
        parse_json_line(b'{"text": "no end\n', fields, "x.jsonl", 3)
    assert str(e.value) == "x.jsonl:3: not valid JSON (Unterminated string starting at column 10)"


def _errors(r: subprocess.CompletedProcess) -> list[str]:
    """validate's error lines, after checking that it refused with nothing but such lines."""
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), r.stderr
    return lines


def test_a_data_path_that_names_a_whole_tree_is_refused_in_one_line(tmp_path):
    """Reproduced: `data.paths = ["/usr/**/*.txt"]` validated for over 60 s (glob followed
    /usr/bin/X11 -> . round and round), and `["/"]` walked the whole file system into a
    PermissionError traceback. A glob or folder that lists more than 10,000 folders
    (data.sources.MAX_WALK_FOLDERS) names much more than a dataset: one line says so and what to
    give instead."""
    wide = tmp_path / "wide"
    for i in range(10_001):
        (wide / str(i)).mkdir(parents=True)
    (wide / "0" / "a.txt").write_text("hello\n")
    for path in (f"{wide}/**/*.txt", str(wide), "/"):
        (line,) = _errors(cli("validate", str(job_file(tmp_path, [path]))))
        assert line.startswith("error: data.paths[0]: ") and "walks more than 10,000 folders" in line, line
        assert "name the data's own folder or files" in line


@pytest.mark.timeout(120)  # glob.glob never ends here (two loops double the paths at every level)
def test_a_glob_through_symlink_loops_ends_and_finds_each_file(tmp_path):
    data = tmp_path / "data"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "a.txt").write_text("hello world\n" * 100)
    (data / "loop1").symlink_to(".")
    (data / "sub" / "up").symlink_to("..")
    (data / "linked").symlink_to("sub")  # an ordinary link to a folder is followed, as glob does
    from clusterfsdp.data.sources import matches

    assert matches(f"{data}/**/*.txt") == [f"{data}/linked/a.txt", f"{data}/sub/a.txt"]
    r = cli("validate", str(job_file(tmp_path, [f"{data}/**/*.txt"])))
    assert r.returncode == 0, r.stderr


def test_matches_that_cannot_be_read_are_one_line_each(tmp_path):
    """A dangling link, a loop of links and a FIFO among a glob's matches: each is named with why."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "good.txt").write_text("hello world\n")
    (data / "dangling.txt").symlink_to(tmp_path / "gone.txt")
    (data / "loop.txt").symlink_to("loop.txt")
    os.mkfifo(data / "fifo.txt")
    assert _errors(cli("validate", str(job_file(tmp_path, [f"{data}/*.txt"])))) == [
        f"error: data.paths[0]: {data}/dangling.txt: cannot read: No such file or directory",
        f"error: data.paths[0]: {data}/fifo.txt: not a regular file (a FIFO, socket or device); not a data source "
        "(.txt or .jsonl, either maybe .gz or .zst; .parquet; or a dataset folder)",
        f"error: data.paths[0]: {data}/loop.txt: cannot read: a loop of symbolic links",
    ]


def test_links_to_files_another_user_cannot_read_are_one_line(other_user, shared_root):
    """Reproduced as a second user: a glob that matched a link to a file it may not read raised
    PermissionError (a traceback), and the link named directly said 'matches no file or
    folder'. Both now say 'cannot read: Permission denied', naming the path."""
    closed = shared_root / "closed"
    closed.mkdir(mode=0o700)  # root's; the other user may not enter it
    (closed / "private.txt").write_text("not yours\n")
    job = shared_root / "job"
    files = {"data/good.txt": b"hello world\n", "data/ok.txt": b"hello\n"}
    other_user.plant(job, files)
    other_user.run(["ln", "-s", str(closed / "private.txt"), str(job / "data" / "link.txt")])
    for paths, bad in (([f"{job}/data/*.txt"], f"{job}/data/link.txt"), ([f"{job}/data/link.txt"], None)):
        text = f'[job]\nrun_root = "{job}/runs"\n[data]\nsource = "files"\npaths = {json.dumps(paths)}\n'
        other_user.plant(job, {"job.toml": text.encode()})
        r = other_user.run([sys.executable, "-m", "clusterfsdp", "validate", str(job / "job.toml")])
        where = bad or str(closed / "private.txt")  # a link named directly is resolved with the job's paths
        assert _errors(r) == [f"error: data.paths[0]: {where}: cannot read: Permission denied"], r.stderr


class _Lines(linefiles.LineFile):
    """A kind of source this package does not have: `.lines` files, each non-blank line one text
    record (the shape of any line-based format)."""

    name = "lines"
    suffix = ".lines"

    def sniff_head(self, f, where, data):
        return [] if f.read(1 << 10).strip() else [f"{where}: no lines"]

    def records(self, reader, src, unit):
        for n, line in enumerate(reader.unit_bytes(src, unit).splitlines()):
            if line.strip():
                yield line.decode(), f"{src.path}:{n}"


def test_a_new_kind_of_source_is_one_class_and_one_registration(tmp_path, monkeypatch):
    """data.kinds is the only place that knows the kinds (issue 35): a kind registered there is
    found by the paths, checked by validate's checks and prepared (planned, read, tokenized)."""
    from clusterfsdp.data import checks, kinds, prepare

    monkeypatch.setitem(kinds.KINDS, "lines", _Lines())
    (tmp_path / "a.lines").write_text("first record\n\nsecond record\nthird record\n")
    (tmp_path / "blank.lines").write_text("\n\n")
    spec = S.loads(
        f'[job]\nrun_root = "{tmp_path}/runs"\n[data]\nsource = "files"\npaths = ["{tmp_path}/*.lines"]\n'
        f'seq_len = 8\ncache_dir = "{tmp_path}/cache"\nprepare_workers = 1\n[train]\nmicro_batch_size = 1\n'
    )
    assert checks.source_problems(spec) == [f"data.paths[0]: {tmp_path}/blank.lines: no lines"]
    (tmp_path / "blank.lines").unlink()
    (ref,) = prepare.ensure(spec, log=lambda _: None)
    manifest = ref.manifest()
    assert manifest is not None and manifest["documents"] == 3, manifest
    assert [s.kind for s in ref.sources] == ["lines"]
