"""Evaluation data (issue 25.1, 25.5, 25.8): a held-out fraction of the README's demo job (one
.txt file, one document) works by holding out windows, said in the log and by `validate`; what
cannot work is refused before queueing; `eval.split` reads another split of a DatasetDict, an
eval set that is the training set is refused and one that shares documents is warned about; a
small eval set's shortfall of `eval.batches` is said. Real prepared data, real workers."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from data_helpers import documents, job
from procs import CORPUS, run_workers

from clusterfsdp.control import runfolder
from clusterfsdp.control import spec as S
from clusterfsdp.control.records import Executor
from clusterfsdp.data import checks, samples
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data.sources import DataError

DEMO = CORPUS.parents[1] / "tiny-cpu.toml"


def demo(tmp: Path, *overrides: str) -> S.JobSpec:
    return S.load(DEMO, [f"job.run_root={str(tmp)!r}", f"data.cache_dir={str(tmp / 'cache')!r}", *overrides])


def coverage(samples_: samples.PreparedSamples, total: int) -> np.ndarray:
    """How many samples of a split read each token of the stream as an input or a label."""
    hits = np.zeros(total, np.int64)
    for k in range(samples_.count):
        for start, length in samples_._ranges(k):
            hits[start : start + length] += 1
    return hits


def test_a_held_out_fraction_of_the_demo_jobs_one_document_holds_out_windows(tmp_path):
    spec = demo(tmp_path, "eval.fraction=0.05")
    assert checks.problems(spec) == []
    said = checks.prepared_state(spec)
    assert any("1 document(s) are too few to hold out whole ones, so 16 windows of 129 tokens" in s for s in said)
    assert (
        "eval: eval.batches = 10: the eval set gives 16 samples, 1 evaluation batch(es) of 2 ranks x 8: each "
        "evaluation runs 1" in said
    )
    lines: list[str] = []
    dataprep.ensure(spec, lines.append)
    data = samples.open_for_training(spec, 0, lines.append)
    assert isinstance(data.eval, samples.PreparedSamples) and isinstance(data.train, samples.PreparedSamples)
    assert data.eval.count >= spec.world_size * spec.train.micro_batch_size
    assert any("windows of 129 tokens are held out instead" in line for line in lines), lines
    # every token is read by one split only
    total = int(data.train.manifest["tokens"])
    assert not np.any((coverage(data.train, total) > 0) & (coverage(data.eval, total) > 0))
    assert any("eval: eval.fraction = 0.05" in s for s in checks.prepared_state(spec))  # prepared: from the index


def test_the_demo_job_with_eval_fraction_trains_and_evaluates(tmp_path):
    """The README's command with `--set eval.fraction=0.05`, two real ranks (gloo)."""
    spec = demo(tmp_path, "eval.fraction=0.05", "train.steps=4", "eval.every_steps=2", "train.log_every=2")
    run = runfolder.create_run(spec, Executor.LOCAL)
    out = run_workers(run, 2)
    evals = [r for r in run.metrics() if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]
    rank0 = out[0][1]
    assert "windows of 129 tokens are held out instead" in rank0
    assert "eval.batches = 10: the eval set gives 16 samples, 1 evaluation batch(es) of 2 ranks x 8" in rank0


def test_data_too_small_for_a_batch_and_an_eval_batch_is_refused_before_queueing(tmp_path):
    spec = demo(tmp_path, "eval.fraction=0.05", "data.seq_len=1024", "train.micro_batch_size=4")
    assert checks.problems(spec) == [
        "data.paths: the training data holds 12,350 tokens: 12 windows of seq_len 1024, fewer than one global "
        "batch plus one evaluation batch (eval.fraction) = 16 samples"
    ]
    assert checks.problems(demo(tmp_path, "data.seq_len=1024", "train.micro_batch_size=4")) == []  # no eval: fits


def dataset_dict(path: Path, train: list[str], test: list[str]) -> Path:
    import datasets

    train_ds = datasets.Dataset.from_list([{"text": t} for t in train])
    test_ds = datasets.Dataset.from_list([{"text": t} for t in test])
    datasets.DatasetDict({"train": train_ds, "test": test_ds}).save_to_disk(str(path))
    return path


TRAIN_DOCS = [d for d in documents(80) if len(d) >= 150]


def test_an_eval_set_that_is_the_training_set_is_refused_and_eval_split_reads_another(tmp_path):
    folder = dataset_dict(tmp_path / "dd", TRAIN_DOCS, ["a held-out document of its own. " * 8, TRAIN_DOCS[3]])
    same = job(tmp_path, [folder], "bytes", f"eval.paths=[{str(folder)!r}]")
    message = "eval.paths: the eval data is the training data (the same sources, split and format: prepared key "
    (problem,) = checks.problems(same)  # before queueing
    assert problem.startswith(message) and "set eval.split (e.g. 'test' of a DatasetDict folder)" in problem
    with pytest.raises(DataError, match=re.escape(message)):
        dataprep.ensure(same, workers=1)
    assert checks.problems(job(tmp_path, [folder], "bytes", f"eval.paths=[{str(folder)!r}]", "eval.split='dev'")) == [
        f"eval.paths[0]: {folder}: no split 'dev' (eval.split; it has: train, test)"
    ]

    spec = job(tmp_path, [folder], "bytes", f"eval.paths=[{str(folder)!r}]", "eval.split='test'")
    assert checks.problems(spec) == []
    lines: list[str] = []
    train, held = dataprep.ensure(spec, lines.append, workers=1)
    assert train.key != held.key
    manifest = held.manifest()
    assert manifest is not None and manifest["documents"] == 2  # the test split
    warning = "eval.paths: 1 of 2 distinct eval documents are also training documents: their eval loss measures"
    assert any(warning in line for line in lines), lines
    assert any(line.startswith(f"warning: {warning}") for line in checks.prepared_state(spec))
    assert checks.problems(spec) == []  # a warning, not a refusal


def test_an_eval_set_with_documents_of_its_own_gives_no_warning(tmp_path):
    folder = dataset_dict(tmp_path / "dd", TRAIN_DOCS, ["a held-out document of its own. " * 8, "another one. " * 12])
    spec = job(tmp_path, [folder], "bytes", f"eval.paths=[{str(folder)!r}]", "eval.split='test'")
    lines: list[str] = []
    dataprep.ensure(spec, lines.append, workers=1)
    assert not any("warning" in line for line in lines), lines
    assert not any(line.startswith("warning") for line in checks.prepared_state(spec))
