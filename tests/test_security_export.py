"""`export --force` must never replace what it reads from or lives in (issue 29.4): reproduced,
`--to` the run root, the run being exported, `.` or `~` with --force deleted it. Each case is
refused with one line and exit 2 before anything is written, through the CLI and through the
worker's own entry point (`python -m clusterfsdp.worker.export`), symlinks resolved."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from tui_helpers import make_run

from clusterfsdp.core import runfolder

RUN_ID = "20260101-120000-aaaa"


@pytest.fixture
def run(tmp_path: Path) -> runfolder.RunFolder:
    return make_run(tmp_path / "work" / "runs", RUN_ID)


def export(run: runfolder.RunFolder, to: str, cwd: Path, home: Path, worker: bool = False):
    module = "clusterfsdp.worker.export" if worker else "clusterfsdp"
    argv = [sys.executable, "-m", module, *([] if worker else ["export"]), str(run.path), "--to", to, "--force"]
    env = {**os.environ, "HOME": str(home)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


@pytest.mark.parametrize(
    ("to", "cwd", "says"),
    [
        ("{root}", "{tmp}", "it is the run root"),
        ("{run}", "{tmp}", "it is the run"),
        ("{run}/checkpoints/step-00000040", "{tmp}", "lies inside the run"),
        (".", "{root}/tiny-cpu", "lies inside the run root"),
        (".", "{tmp}/work", "contains the run"),
        ("~", "{tmp}", "your home folder"),
        ("/", "{tmp}", "your home folder"),
        ("{tmp}/link-to-run", "{tmp}", "it is the run"),
    ],
)
def test_export_refuses_a_destination_that_holds_what_it_reads(run, tmp_path, to, cwd, says):
    home = tmp_path / "home"
    home.mkdir()
    (tmp_path / "link-to-run").symlink_to(run.path)
    fill = {"tmp": str(tmp_path), "root": str(tmp_path / "work" / "runs"), "run": str(run.path)}
    before = _tree(tmp_path / "work")
    r = export(run, to.format(**fill), Path(cwd.format(**fill)), home)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "refusing --to" in r.stderr and says in r.stderr, r.stderr
    assert _tree(tmp_path / "work") == before and home.is_dir()


def test_the_workers_entry_point_refuses_too(run, tmp_path):
    r = export(run, str(tmp_path / "work" / "runs"), tmp_path, tmp_path, worker=True)
    assert r.returncode == 2 and "refusing --to" in r.stderr and "it is the run root" in r.stderr, r.stderr
    assert run.path.is_dir()


def test_a_model_source_folder_is_refused_and_an_ordinary_destination_is_not(run, tmp_path):
    source = tmp_path / "models" / "base"
    source.mkdir(parents=True)
    text = run.job_toml.read_text().replace('name_or_path = ""', f'name_or_path = "{source}"', 1)
    run.job_toml.write_text(text.replace('preset = "llama-tiny"', 'preset = ""', 1))
    assert run.spec().model.name_or_path == str(source)
    problem = runfolder.export_refusal(run, tmp_path / "models")
    assert problem is not None and "contains the model's source folder" in problem
    assert runfolder.export_refusal(run, tmp_path / "exports" / "hf") is None


def test_the_runs_data_and_its_data_cache_are_refused(run, tmp_path):
    """Reproduced: `export --force --to` the run's data folder or its data.cache_dir replaced it.
    Each data path (a glob's folder before its first wildcard) and data.cache_dir are refused
    like the model's source folder: the folder itself, a folder holding it, one inside it."""
    corpus, shards, cache = tmp_path / "corpus", tmp_path / "shards", tmp_path / "token-cache"
    for folder in (corpus, shards, cache):
        folder.mkdir()
    (corpus / "a.txt").write_text("hello\n")
    text = run.job_toml.read_text().replace('source = "synthetic"', 'source = "files"', 1)
    text = text.replace("paths = []", f'paths = ["{corpus}/a.txt", "{shards}/*/part-*.jsonl"]', 1)
    run.job_toml.write_text(text.replace('cache_dir = ""', f'cache_dir = "{cache}"', 1))
    assert run.spec().data.cache_dir == str(cache)
    cases = {
        corpus / "a.txt": "it is the run's data",
        corpus: "contains the run's data",
        shards: "it is the run's data",
        shards / "exports": "lies inside the run's data",
        cache: "it is the data cache (data.cache_dir)",
        cache / "hf": "lies inside the data cache",
    }
    for to, says in cases.items():
        problem = runfolder.export_refusal(run, to)
        assert problem is not None and says in problem, (to, problem)
    assert runfolder.export_refusal(run, tmp_path / "exports" / "hf") is None
    r = export(run, str(corpus), tmp_path, tmp_path)
    assert r.returncode == 2 and "contains the run's data" in r.stderr and (corpus / "a.txt").is_file(), r.stderr
