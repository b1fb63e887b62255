"""Evaluation data (issue 25.1, 25.5, 25.8): a held-out fraction of the README's demo job (one
.txt file, one document) works by holding out windows, said in the log and by `validate`; what
cannot work is refused before queueing; `eval.split` reads another split of a DatasetDict, an
eval set that is the training set is refused and one that shares documents is warned about; a
small eval set's shortfall of `eval.batches` is said. Real prepared data, real workers."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest
from data_helpers import documents, job
from procs import CORPUS, run_workers

from clusterfsdp.core import runfolder
from clusterfsdp.core import spec as S
from clusterfsdp.core.records import Executor
from clusterfsdp.data import checks, rankdata, samples
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
    bound = "whole documents (1) cannot make one evaluation batch and one global batch, so 16 windows"  # not prepared
    assert any(bound in s for s in said)
    assert (
        "eval: eval.batches = 10: the eval set gives 16 samples, 1 evaluation batch(es) of 2 ranks x 8: each "
        "evaluation runs 1" in said
    )
    lines: list[str] = []
    dataprep.ensure(spec, lines.append)
    data = rankdata.open_for_training(spec, 0, lines.append)
    assert isinstance(data.eval, samples.PreparedSamples) and isinstance(data.train, samples.PreparedSamples)
    assert data.eval.count >= spec.world_size * spec.train.micro_batch_size
    held = "eval.fraction = 0.05: the 0 of 1 documents it holds out give fewer than one evaluation batch, so 16 windows"
    assert any(held in line for line in lines), lines
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


def chat_mixture(tmp: Path, *overrides: str) -> S.JobSpec:
    """Issue 40's first-day job: 600 ShareGPT conversations (weight 0.7) and 400 short Alpaca
    records (0.3), chat, seq_len 128, 2 ranks x micro-batch 8, a real BPE with a ChatML template."""
    import random

    from data_helpers import WORDS, make_tokenizer, write_jsonl

    rng = random.Random(0)

    def words(lo: int, hi: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))

    sharegpt = [
        {"conversations": [x for _ in range(rng.randint(1, 3)) for x in ({"from": "human", "value": words(3, 20)},
                                                                         {"from": "gpt", "value": words(3, 30)})]}
        for _ in range(600)
    ]  # fmt: skip
    alpaca = [{"instruction": words(2, 3), "input": "", "output": "yes"} for _ in range(400)]
    tokenizer = tmp / "bpe"
    if not tokenizer.is_dir():
        make_tokenizer(tokenizer)
    text = f"""
[job]
run_root = "{tmp}"
[data]
source = "files"
format = "chat"
tokenizer = "{tokenizer}"
seq_len = 128
cache_dir = "{tmp / "cache"}"
prepare_workers = 1
[[data.sources]]
path = "{write_jsonl(tmp / "sharegpt.jsonl", sharegpt)}"
weight = 0.7
messages_key = "conversations"
role_key = "from"
content_key = "value"
roles = {{ human = "user", gpt = "assistant" }}
[[data.sources]]
path = "{write_jsonl(tmp / "alpaca.jsonl", alpaca)}"
weight = 0.3
prompt = "{{instruction}}\\n\\n{{input}}"
response = "{{output}}"
[train]
micro_batch_size = 8
[slurm]
tasks_per_node = 2
"""
    return S.loads(text, list(overrides))


def test_a_held_out_fraction_too_small_for_a_source_of_a_mixture_is_refused_with_the_fraction_to_set(tmp_path):
    """Issue 40: `data prepare` said 'eval samples: 0' for the Alpaca source with a note wrong in
    every clause, validate said ok, and the run died in its first evaluation (ZeroDivisionError).
    Now prepare, validate and submit refuse it in one line with the least fraction that works,
    which is then accepted and reads eval samples from every source."""
    spec = chat_mixture(tmp_path, "eval.fraction=0.1")
    alpaca = spec.data.sources[1].path
    refused = re.compile(
        rf"eval\.fraction: 0\.1 holds out \d+ of the 400 documents of data\.sources\[1\] \({re.escape(alpaca)}\): "
        r"tokens for \d+ eval and \d+ training samples of seq_len 128 \(documents packing\), fewer than one "
        r"evaluation batch \(2 ranks x 8\) = 16, and its documents are too short to hold out windows of 129 tokens "
        r"instead: raise eval\.fraction to at least (0\.\d+) or set eval\.paths"
    )
    with pytest.raises(DataError) as e:
        dataprep.ensure(spec, workers=1)
    found = refused.fullmatch(str(e.value))
    assert found, str(e.value)
    least = float(found[1])
    # prepared, the indexes not built: validate builds them and refuses, one line
    assert checks.problems(spec) == [str(e.value)]
    below = checks.problems(chat_mixture(tmp_path, f"eval.fraction={least - 0.01:.2f}"))
    assert len(below) == 1 and f"raise eval.fraction to at least {least:g}" in below[0]
    fits = chat_mixture(tmp_path, f"eval.fraction={least}")
    assert checks.problems(fits) == []
    held = rankdata.open_for_training(fits, 0, lambda _: None).eval
    assert held is not None and all(part.count > 0 for part in held.parts)  # type: ignore[union-attr]
    batches = [held.batch(k * 16, 1, 2, 8) for k in range(held.count // 16)]  # rank 1's side of every eval batch
    assert batches and all(b.label_count for b in batches)


def test_one_source_too_small_to_hold_out_an_evaluation_batch_is_refused_with_the_fraction_to_set(tmp_path):
    """The same Alpaca records alone (data.paths, native chat records): refused with what to set."""
    spec = chat_mixture(tmp_path, "eval.fraction=0.1")
    records = [{"messages": [{"role": "user", "content": "quiet river"}, {"role": "assistant", "content": "yes"}]}]
    from data_helpers import write_jsonl

    path = write_jsonl(tmp_path / "short.jsonl", records * 400)
    one = dataclasses.replace(spec, data=dataclasses.replace(spec.data, sources=[], paths=[str(path)]))
    with pytest.raises(DataError) as e:
        dataprep.ensure(one, workers=1)
    problem = str(e.value)
    assert checks.problems(one) == [problem]  # prepared: validate says the same
    assert problem.startswith("eval.fraction: 0.1 holds out ") and "documents of the training data: " in problem
    assert re.search(r": raise eval\.fraction to at least 0\.\d+ or set eval\.paths$", problem), problem


def test_a_source_of_a_mixture_left_without_samples_is_refused_before_training(tmp_path):
    """data.overlong = 'drop' leaving a source no training samples: the mixture would divide by
    zero reading it; refused with the source and what to set."""
    from data_helpers import write_jsonl

    short = write_jsonl(tmp_path / "short.jsonl", [{"text": "a few words here"}] * 40)
    long = write_jsonl(tmp_path / "long.jsonl", [{"text": "many words " * 40}] * 10)
    spec = job(tmp_path, [short], "bytes", "data.packing='documents'", "data.overlong='drop'")
    mixed = dataclasses.replace(
        spec, data=dataclasses.replace(spec.data, paths=[], sources=[S.DataSource(path=str(short)),
                                                                     S.DataSource(path=str(long))])
    )  # fmt: skip
    message = (
        f"data.sources[1] ({long}): 0 train samples of seq_len 32 (documents packing) (data.overlong = 'drop' left "
        "out 10 documents longer than seq_len), and the mixture reads every source in its proportion: set "
        "data.overlong = 'split' or raise data.seq_len"
    )
    with pytest.raises(DataError, match=re.escape(message)):
        dataprep.ensure(mixed, workers=1)
    assert message in checks.problems(mixed)
