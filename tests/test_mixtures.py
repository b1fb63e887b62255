"""Several datasets in one run (issue 23.2): `[[data.sources]]` with weights and field mappings.
Real files prepared by the real prepare (the byte tokenizer, and a real BPE with a ChatML
template for the chat mappings), read back through the same `open_for_training` a rank uses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from data_helpers import WORDS, make_tokenizer, write_jsonl, write_parquet
from procs import CORPUS, make_run, run_workers, tiny_job_toml

from clusterfsdp.control import status
from clusterfsdp.core import ckptfolder
from clusterfsdp.core import spec as S
from clusterfsdp.data import cache, checks, samplesets, samplestats
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data.mixsamples import MixtureSamples
from clusterfsdp.data.mixture import Schedule, block_counts
from clusterfsdp.data.rankdata import open_for_training
from clusterfsdp.worker.generate import SampleGenerator


def _job(tmp: Path, sources: list[dict], *extra: str, tokenizer: str = "bytes", top: str = "") -> S.JobSpec:
    """A 1-rank job reading `sources` as [[data.sources]] tables (seq_len 32, micro-batch 2)."""
    tables = "".join(
        "[[data.sources]]\n" + "".join(f"{k} = {S.render_value(v)}\n" for k, v in s.items()) for s in sources
    )
    text = f"""
[job]
run_root = "{tmp}"
seed = 5
[data]
source = "files"
tokenizer = "{tokenizer}"
seq_len = 32
cache_dir = "{tmp / "cache"}"
{top}
{tables}
[train]
micro_batch_size = 2
"""
    return S.loads(text, list(extra))


def _letters(tmp: Path) -> list[Path]:
    """Three sources of different sizes, each of one letter (its tokens tell its samples apart)."""
    out = []
    for letter, n in (("a", 60), ("b", 200), ("c", 30)):
        out.append(write_jsonl(tmp / f"{letter}.jsonl", [{"text": letter * (20 + i % 17)} for i in range(n)]))
    return out


def _global(mix: MixtureSamples, start: int, stop: int, world: int, micro: int) -> list[np.ndarray]:
    """The samples of positions [start, stop) as `world` ranks read them, batch after batch."""
    out = []
    for consumed in range(start, stop, world * micro):
        for rank in range(world):
            out += list(mix.batch(consumed, rank, world, micro).input_ids.numpy())
    return out


def test_a_weighted_mixture_gives_its_token_shares_and_resumes_exactly(tmp_path):
    files = _letters(tmp_path)
    weights = [0.5, 0.3, 0.2]
    spec = _job(tmp_path, [{"path": str(f), "weight": w} for f, w in zip(files, weights, strict=True)])
    lines: list[str] = []
    data = open_for_training(spec, 0, lines.append)  # rank 0 prepares each source, then opens the mixture
    mix = data.train
    assert isinstance(mix, MixtureSamples)
    # every token of a sample is one source's: its letter (or EOS) tells which
    letter_ids = [int(np.bincount(p.sample(0).input_ids).argmax()) for p in mix.parts]
    seen = _global(mix, 0, 1200, 1, 4)
    tokens = np.zeros(3)
    for ids in seen:
        counts = [int((ids == t).sum()) for t in letter_ids]
        assert sorted(counts)[1] == 0, "a sample mixes sources"
        tokens[int(np.argmax(counts))] += len(ids)
    assert np.abs(tokens / tokens.sum() - weights).max() < 0.02, tokens / tokens.sum()
    # a restart (the data reopened) on 3 ranks from position 600 reads what the run would have read
    again = open_for_training(spec, 0, lines.append).train
    assert isinstance(again, MixtureSamples)
    resumed = _global(again, 600, 1200, 3, 2)
    assert all(np.array_equal(a, b) for a, b in zip(seen[600:], resumed, strict=True))
    # an epoch of a mixture: as many samples as its sources together
    assert mix.count == sum(p.count for p in mix.parts)
    one_epoch = _job(
        tmp_path, [{"path": str(f), "weight": w} for f, w in zip(files, weights, strict=True)], "train.epochs=1"
    )
    assert samplesets.total_steps(one_epoch, mix.count) == -(-mix.count // 2)
    # the shares are said by the prepare (the job's log) and by validate
    shares = [line for line in lines if line.startswith("data: mixture: ")]
    assert len(shares) == 6 and "weight 0.5, " in shares[0] and "50.0% of the samples" in shares[0]
    report = checks.prepared_state(spec)
    assert [line for line in report if line.startswith("train: mixture: ")] == [
        line.replace("data: ", "train: ", 1) for line in shares[:3]
    ]
    assert data.key != cache.dataset_refs(spec)[0].key  # the checkpoint's data key names the mixture
    # eval data that is one of the sources is refused like eval data that is the training data
    same = _job(
        tmp_path,
        [{"path": str(f), "weight": w} for f, w in zip(files, weights, strict=True)],
        f"eval.paths=['{files[1]}']",
    )
    assert [p for p in checks.problems(same) if "the eval data is the training data" in p]


def test_eval_fraction_holds_out_of_every_source_and_reads_them_in_the_mixtures_proportions(tmp_path):
    files = _letters(tmp_path)
    tables = [{"path": str(f), "weight": w} for f, w in zip(files, (0.5, 0.3, 0.2), strict=True)]
    spec = _job(tmp_path, tables, "eval.fraction=0.2")
    data = open_for_training(spec, 0, lambda _: None)
    held, train = data.eval, data.train
    assert isinstance(held, MixtureSamples) and isinstance(train, MixtureSamples)
    refs = [r for r in cache.dataset_refs(spec) if r.part >= 0]
    metas = [samplesets.index_meta(r, spec, "eval") for r in refs]
    assert all(m and m["holdout"] == "documents" for m in metas)
    assert held.count == sum(int(m["samples"]) for m in metas if m) == sum(p.count for p in held.parts)
    whole = open_for_training(_job(tmp_path, tables), 0, lambda _: None).train
    assert isinstance(whole, MixtureSamples)  # the training indexes leave the held-out documents out
    assert all(p.count < q.count for p, q in zip(train.parts, whole.parts, strict=True))
    # the fixed eval order draws from every source
    letters = [int(np.bincount(p.sample(0).input_ids).argmax()) for p in train.parts]
    first = np.concatenate(_global(held, 0, 40, 1, 2))
    assert all((first == t).any() for t in letters)
    assert [line for line in checks.prepared_state(spec) if line.startswith("eval: ")] == [
        f"eval: {held.count:,} samples held out of the sources "
        f"({', '.join(str(p.count) for p in held.parts)}), read in the mixture's proportions"
    ]
    # eval samples' prompts come from every source in turn (worker/generate.py)
    gen = SampleGenerator(_job(tmp_path, tables, "eval.fraction=0.2", "eval.samples=3"), held)
    assert [int(np.bincount(ids).argmax()) for ids in gen.prompts] == letters


def test_the_interleave_keeps_every_prefix_near_the_weights_and_never_leaves_a_source_out():
    assert block_counts([0.5, 0.3, 0.2]) == [2048, 1229, 819]
    assert block_counts([1.0, 1e-9]) == [4095, 1]
    schedule = Schedule([0.5, 0.3, 0.2], seed=1)
    taken = [0, 0, 0]
    for p in range(5000):
        source, k = schedule(p)
        assert k == taken[source]  # each source's samples in order, none skipped or repeated
        taken[source] += 1
        assert all(abs(t - (p + 1) * c / 4096) <= 1.5 for t, c in zip(taken, schedule.counts, strict=True))


def _chat_records() -> tuple[list[dict], list[dict], list[dict]]:
    """The same conversations natively, ShareGPT-style and Alpaca-style."""
    native, sharegpt, alpaca = [], [], []
    for i in range(40):
        instruction = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(3 + i % 4))
        extra = WORDS[i % len(WORDS)] if i % 3 else ""
        answer = f"{WORDS[(i * 7) % len(WORDS)]} {i}"
        user = f"{instruction}\n\n{extra}".strip()
        native.append({"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]})
        sharegpt.append(
            {"id": i, "conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": answer}]}
        )
        alpaca.append({"instruction": instruction, "input": extra, "output": answer})
    return native, sharegpt, alpaca


def _stream(ref: cache.DatasetRef) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, loss mask) of a prepared dataset, read back from its shard files."""
    manifest = ref.manifest()
    assert manifest is not None
    shards = range(len(manifest["shards"]))
    return (
        np.concatenate([np.fromfile(ref.folder / "shards" / f"{i:05d}.tok", manifest["dtype"]) for i in shards]),
        np.concatenate([np.fromfile(ref.folder / "shards" / f"{i:05d}.msk", np.uint8) for i in shards]),
    )


SHAREGPT = {
    "messages_key": "conversations",
    "role_key": "from",
    "content_key": "value",
    "roles": {"human": "user", "gpt": "assistant"},
}
ALPACA = {"prompt": "{instruction}\n\n{input}", "response": "{output}"}


def test_sharegpt_and_alpaca_mappings_give_the_tokens_and_masks_of_native_chat_records(tmp_path):
    tokenizer = make_tokenizer(tmp_path / "bpe")
    native, sharegpt, alpaca = _chat_records()
    files = [
        write_jsonl(tmp_path / "native.jsonl", native),
        write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt),
        write_parquet(tmp_path / "alpaca.parquet", alpaca),  # a table: several columns read
    ]
    sources = [{"path": str(files[0])}, {"path": str(files[1]), **SHAREGPT}, {"path": str(files[2]), **ALPACA}]
    top = 'format = "chat"\nprepare_workers = 1'  # in this process: no pool to start
    spec = _job(tmp_path, sources, tokenizer=str(tokenizer), top=top)
    assert checks.problems(spec) == []
    refs = dataprep.ensure(spec, log=lambda _: None)
    assert len({r.key for r in refs}) == 3  # the mapping is in each prepared dataset's key
    ids, mask = _stream(refs[0])
    assert mask.sum() and not mask.all()
    for ref in refs[1:]:
        got_ids, got_mask = _stream(ref)
        assert np.array_equal(got_ids, ids) and np.array_equal(got_mask, mask)
    # another mapping of the same file is another prepared dataset
    other = _job(
        tmp_path,
        [*sources[:2], {**sources[2], "prompt": "{instruction}"}],
        tokenizer=str(tokenizer),
        top='format = "chat"',
    )
    assert cache.dataset_refs(other)[2].key != refs[2].key


def test_a_mapping_that_names_a_key_absent_from_the_first_record_is_refused_with_one_line(tmp_path):
    _, sharegpt, _ = _chat_records()
    plain = write_jsonl(tmp_path / "plain.jsonl", [{"text": "some words"}])
    chats = write_jsonl(tmp_path / "sharegpt.jsonl", sharegpt)
    sources = [{"path": str(plain)}, {"path": str(chats), "format": "chat", "messages_key": "dialogue"}]
    tokenizer = str(make_tokenizer(tmp_path / "bpe"))
    for policy in ("error", "skip"):  # skipping would skip every record: refused either way
        spec = _job(tmp_path, sources, f"data.bad_records={policy}", tokenizer=tokenizer)
        assert checks.problems(spec) == [
            f"data.sources[1].path: {chats}:1: no 'dialogue' key (messages_key; the record has: conversations, id)"
        ]
    spec = _job(tmp_path, [sources[0], {**sources[1], **SHAREGPT, "role_key": "speaker"}], tokenizer=tokenizer)
    assert checks.problems(spec) == [
        f"data.sources[1].path: {chats}:1: conversations[0]: no 'speaker' key (role_key; the message has: from, value)"
    ]
    # ShareGPT without `roles`: its role values are named, and the mapping that makes one the assistant
    no_roles = {k: v for k, v in SHAREGPT.items() if k != "roles"}
    spec = _job(tmp_path, [sources[0], {**sources[1], **no_roles}], tokenizer=tokenizer)
    assert checks.problems(spec) == [
        f"data.sources[1].path: {chats}:1: 'conversations' has no 'assistant' message: nothing to train on (its "
        """roles: 'human', 'gpt'; map them with roles = { human = "user", gpt = "assistant" } in this """
        "[[data.sources]] entry)"
    ]
    # the same file in data.paths: the message's keys are named, and where other keys are mapped
    spec = _job(tmp_path, [], "data.sources=[]", f"data.paths=['{chats}']", "data.messages_key=conversations",
                tokenizer=tokenizer, top='format = "chat"')  # fmt: skip
    assert checks.problems(spec) == [
        f"data.paths[0]: {chats}:1: conversations[0] is not an object with string 'role' and 'content' (it has: "
        "from, value; role_key and content_key of a [[data.sources]] entry name others)"
    ]


@pytest.mark.parametrize(
    ("tables", "extra", "error"),
    [
        ([{"path": "a.jsonl", "weight": 0}], (), "data.sources[0].weight: must be a number > 0, found 0.0"),
        ([{"path": "a.jsonl", "prompt": "{a.b}"}], (), "data.sources[0].prompt: not a template of column names"),
        ([{"path": "a.jsonl", "prompt": "{x}", "format": "chat"}], (), "data.sources[0].response: a conversation"),
        ([{"weight": 1}], (), "data.sources[0].path: each source needs a path"),
        ([{"path": "a.jsonl"}], ("data.paths=['b.jsonl']",), "data.sources: give data.paths or [[data.sources]]"),
    ],
)
def test_bad_sources_are_refused_at_load(tmp_path, tables, extra, error):
    with pytest.raises(S.SpecError) as e:
        _job(tmp_path, tables, *extra)
    assert any(line.startswith(error) for line in e.value.errors), e.value.errors


def test_sources_round_trip_through_the_run_folders_job_toml(tmp_path):
    spec = _job(tmp_path, [{"path": "/d/a.jsonl", "weight": 0.7, **SHAREGPT}, {"path": "/d/b.parquet", **ALPACA}])
    again = S.loads(S.dumps(spec))
    assert again.data.sources == spec.data.sources and again.data.sources[1].prompt == "{instruction}\n\n{input}"
    assert any(line.startswith("  sources[].roles = {}") for line in S.describe_schema("data.sources"))


def test_a_run_trains_on_a_mixture_for_its_epochs(tmp_path):
    """A real 1-rank run (llama-tiny, gloo): train.epochs counts the mixture's samples, every row
    has its epoch, the log gives each source's share, and the checkpoint records the mixture."""
    files = _letters(tmp_path)
    tables = "".join(f'[[data.sources]]\npath = "{f}"\nweight = {w}\n' for f, w in zip(files, (3, 1, 1), strict=True))
    job = tiny_job_toml("mix", seed=2, steps=0, tail=tables).replace(f'paths = ["{CORPUS}"]\n', "")
    run = make_run(job.replace("steps = 0\n", "epochs = 0.05\n"), tmp_path, ["slurm.tasks_per_node=1"])
    out = run_workers(run, 1)[0][1]
    spec = S.load(run.job_toml)
    counts = [
        int(m["samples"]) for m in (samplesets.index_meta(r, spec, "train") for r in cache.dataset_refs(spec)) if m
    ]
    expected = -(-round(0.05 * sum(counts)) // 2)
    rows = run.metrics()
    assert [r["step"] for r in rows] == list(range(1, expected + 1))
    assert rows[-1]["epoch"] == pytest.approx(expected * 2 / sum(counts))
    assert f"data: mixture: data.sources[0] ({files[0]}): weight 3, {counts[0]:,} samples, 60.0% of the samples" in out
    final = ckptfolder.find(run.checkpoints_dir())
    assert final is not None and final.meta["data"] not in {"", *(r.key for r in cache.dataset_refs(spec))}
    # data.json: each source's statistics and share (`status`), and the steps rank 0 counted (the TUI)
    assert samplestats.steps(run.data_file) == expected == status.run_status(run).steps
    lines = samplestats.lines(run.data_file)
    for i, (f, n) in enumerate(zip(files, counts, strict=True)):
        source = [line for line in lines if line.endswith(f"(data.sources[{i}] ({f}))")]
        assert len(source) == 1 and source[0].startswith(f"train samples: {n:,} of seq_len 64"), lines
    share = f"train: mixture: data.sources[0] ({files[0]}): weight 3, {counts[0]:,} samples, 60.0% of the samples"
    assert any(line.startswith(share) for line in lines), lines


def test_a_hub_dataset_id_as_a_source_is_resolved_like_one_in_data_paths(tmp_path):
    """`validate` (offline, the HF cache only) reads a source named by a hub id from its snapshot;
    without the snapshot the source is named in one line."""
    from test_modelsource import cli, put_in_hub_cache

    hf_home, files = tmp_path / "hf", tmp_path / "dataset"
    files.mkdir()
    write_jsonl(files / "train.jsonl", [{"body": f"document {i} " * 20} for i in range(40)])
    put_in_hub_cache(hf_home, "org/corpus", files, kind="datasets")
    job = tmp_path / "job.toml"
    job.write_text(
        f'[job]\nrun_root = "{tmp_path / "runs"}"\n[data]\nsource = "files"\ntokenizer = "bytes"\nseq_len = 32\n'
        '[[data.sources]]\npath = "org/corpus"\ntext_key = "body"\n'
    )
    r = cli("validate", str(job), env={"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0 and "train: not prepared yet" in r.stdout, r.stdout + r.stderr
    r = cli("validate", str(job), env={"HF_HOME": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and r.stderr.startswith("error: data.sources[0].path: 'org/corpus' is not a local path")
