"""Samples from prepared data (data/index.py, data/samples.py): packing 'documents' never
lets a sample's context cross a document (position ids restart, and sdpa and eager attention
really keep documents apart), overlong documents become seq_len pieces, the held-out split is
disjoint, and the read order is a seeded bijection. One process, CPU, real files."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from data_helpers import documents, write_jsonl

from clusterfsdp.core import spec as S
from clusterfsdp.core.presets import PRESETS
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data import rankdata
from clusterfsdp.data import samples as datamod
from clusterfsdp.data.index import Permutation
from clusterfsdp.worker.loss import IGNORE_INDEX

SEQ = 64


def open_samples(tmp: Path, packing: str, *extra: str, docs: list[str] | None = None) -> rankdata.TrainingData:
    tmp.mkdir(parents=True, exist_ok=True)
    path = write_jsonl(tmp / "d.jsonl", [{"text": d} for d in (docs or documents(80))])
    spec = S.loads(
        f'[job]\nrun_root = "{tmp}"\nseed = 3\n[data]\nsource = "files"\npaths = ["{path}"]\nseq_len = {SEQ}\n'
        f'packing = "{packing}"\n[train]\nmicro_batch_size = 2\n',
        list(extra),
    )
    dataprep.ensure(spec, workers=1)
    return rankdata.open_for_training(spec, 0, print)


def all_samples(samples: datamod.PreparedSamples):
    return [samples.sample(k) for k in range(samples.count)]


def test_documents_packing_keeps_every_sample_inside_its_documents(tmp_path):
    docs = documents(80)
    data = open_samples(tmp_path, "documents", docs=docs)
    samples = data.train
    assert isinstance(samples, datamod.PreparedSamples) and samples.documents
    eos = samples.pad
    texts = {d.encode() for d in docs}
    trained = 0
    for sample in all_samples(samples):
        ids, labels, positions = sample.input_ids, sample.labels, sample.positions
        assert positions is not None and len(ids) == len(labels) == len(positions) == SEQ
        # split the sample where the positions restart: every part is one document (or one piece of one)
        starts = [i for i in range(SEQ) if positions[i] == 0] + [SEQ]
        for a, b in itertools.pairwise(starts):
            seg_ids, seg_labels = ids[a:b], labels[a:b]
            assert list(positions[a:b]) == list(range(b - a))
            real = seg_labels != IGNORE_INDEX
            if not real.any():
                continue  # padding
            assert real.all() and np.array_equal(seg_ids[1:], seg_labels[:-1])  # labels = next token, same doc
            body = bytes(np.append(seg_ids, seg_labels[-1])[np.append(seg_ids, seg_labels[-1]) < 256].astype(np.uint8))
            assert any(body in t for t in texts), body  # contiguous text of ONE document
            assert eos not in seg_ids  # EOS is only ever a label: no context runs past a document's end
            trained += int(real.sum())
    # every document position is trained exactly once: L - 1 per document of L tokens (text + EOS)
    assert trained == sum(len(d.encode()) for d in docs)


def test_an_overlong_document_becomes_pieces_of_seq_len(tmp_path):
    long_doc = "abcdefghij" * 30  # 300 bytes + EOS: 300 positions = 4 pieces of 64 and one of 44
    data = open_samples(tmp_path, "documents", docs=[long_doc, "short one"])
    samples = data.train
    assert isinstance(samples, datamod.PreparedSamples)
    got = all_samples(samples)
    assert samples.count == 5
    full = [g for g in got if (g.labels != IGNORE_INDEX).sum() == SEQ]
    assert len(full) == 4 and all(g.positions is not None and list(g.positions) == list(range(SEQ)) for g in full)
    text = b"".join(bytes(g.input_ids.astype(np.uint8)) for g in full)
    assert text == long_doc.encode()[: 4 * SEQ]
    last = got[-1].positions
    assert last is not None and list(last[:44]) == list(range(44)) and last[44] == 0  # remainder, then "short one"


def test_concat_without_holdout_is_todays_windows(tmp_path):
    data = open_samples(tmp_path, "concat")
    samples = data.train
    assert isinstance(samples, datamod.PreparedSamples) and not samples.table and samples.all_labels_trained
    stream = np.concatenate([samples.tokens.read(0, samples.manifest["tokens"])])
    for k in (0, 5, samples.count - 1):
        sample = samples.sample(k)
        assert sample.positions is None
        ids, labels = sample.input_ids, sample.labels
        window = stream[k * SEQ : k * SEQ + SEQ + 1]
        assert np.array_equal(ids, window[:-1]) and np.array_equal(labels, window[1:])


@pytest.mark.parametrize("packing", ["concat", "documents"])
def test_held_out_documents_are_never_trained_on(tmp_path, packing):
    docs = [f"<{i:03d}>" * (2 + i % 25) for i in range(200)]  # markers of the document in every part of it
    data = open_samples(tmp_path, packing, "eval.fraction=0.2", docs=docs)
    assert data.train is not None and data.eval is not None
    seen = {"train": set(), "eval": set()}
    for role, samples in (("train", data.train), ("eval", data.eval)):
        assert isinstance(samples, datamod.PreparedSamples)
        for sample in all_samples(samples):
            ids = sample.input_ids
            text = bytes(ids[ids < 256].astype(np.uint8)).decode()
            seen[role] |= {int(m) for m in re.findall(r"<(\d{3})>", text)}
    assert seen["train"] and seen["eval"] and not (seen["train"] & seen["eval"])
    assert 20 <= len(seen["eval"]) <= 60  # about 20% of 200


def test_permutation_is_a_seeded_bijection():
    for n in (1, 2, 3, 7, 64, 100, 1000):
        order = [Permutation(n, 5, 0)(i) for i in range(n)]
        assert sorted(order) == list(range(n))
    a = [Permutation(1000, 5, 0)(i) for i in range(1000)]
    assert a != [Permutation(1000, 5, 1)(i) for i in range(1000)] and a != list(range(1000))


def _model(attn: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(**PRESETS["llama-tiny"])
    config._attn_implementation = attn
    config.use_cache = False
    return LlamaForCausalLM(config).float().eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_documents_do_not_attend_to_each_other(attn):
    """The logits of a document packed after another equal those of the document alone, whatever
    the document before it: transformers builds a block-diagonal causal mask from position ids
    that restart (sdpa, eager). Without the restart they would differ."""
    from clusterfsdp.worker import loss as lossmod

    model = _model(attn)
    g = torch.Generator().manual_seed(1)
    a1, a2, b = (torch.randint(0, 256, (n,), generator=g) for n in (23, 23, 17))
    alone = model(input_ids=b[None]).logits[0]
    pos = torch.cat([torch.arange(23), torch.arange(17)])[None]
    with torch.no_grad():
        for a in (a1, a2):
            packed = model(input_ids=torch.cat([a, b])[None], position_ids=pos).logits[0, 23:]
            torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
        crossing = model(input_ids=torch.cat([a1, b])[None]).logits[0, 23:]
    assert not torch.allclose(crossing, alone, atol=1e-3)
    # the fused loss path passes the position ids too: loss of [a | b] = loss of a + loss of b
    lossmod.attach(model, compile=False)
    ids = torch.cat([a1, b])
    labels = torch.cat([a1[1:], torch.tensor([IGNORE_INDEX]), b[1:], torch.tensor([IGNORE_INDEX])])
    with torch.no_grad():
        packed_sum = lossmod.causal_lm_loss(
            model, ids[None, :-1], labels[None, :-1], position_ids=pos[:, :-1], reduction="sum"
        )
        sep = sum(lossmod.causal_lm_loss(model, x[None, :-1], x[None, 1:], reduction="sum") for x in (a1, b))
    torch.testing.assert_close(packed_sum, sep, rtol=1e-5, atol=1e-4)


def test_batches_carry_position_ids_only_for_documents_packing(tmp_path):
    docs = open_samples(tmp_path / "d", "documents").train
    concat = open_samples(tmp_path / "c", "concat").train
    assert docs is not None and concat is not None
    b = docs.batch(0, 1, 2, 2)
    assert b.position_ids is not None and b.position_ids.shape == (2, SEQ) and (b.position_ids == 0).sum() >= 2
    assert concat.batch(0, 1, 2, 2).position_ids is None
    meta = json.loads(next((tmp_path / "d").rglob("meta.json")).read_text())
    assert meta["packing"] == "documents" and 0 < meta["padding"] < 0.5


def test_reads_across_many_shards_keep_few_files_open(tmp_path, monkeypatch):
    """A corpus of many shards read at random: every range equals the stream, and the reader
    never holds more than MAX_OPEN shard files open."""
    text = "".join(documents(80)) * 2
    (tmp_path / "t.txt").write_text(text)
    spec = S.loads(
        f'[job]\nrun_root = "{tmp_path}"\n[data]\nsource = "files"\npaths = ["{tmp_path / "t.txt"}"]\nseq_len = {SEQ}\n'
    )
    dataprep.ensure(spec, workers=1, unit_bytes=700)
    monkeypatch.setattr(datamod._Reader, "MAX_OPEN", 3)
    samples = rankdata.open_for_training(spec, 0, print).train
    assert isinstance(samples, datamod.PreparedSamples) and len(samples.manifest["shards"]) > 20
    stream = np.frombuffer(text.encode(), np.uint8)
    rng = np.random.default_rng(0)
    for start in rng.integers(0, len(stream) - 2000, 200).tolist():
        assert np.array_equal(samples.tokens.read(start, 1500), stream[start : start + 1500])
        assert len(samples.tokens.fds) <= 3


def test_the_flattened_micro_batch_flash_attention_gets_has_the_same_loss(tmp_path):
    """With flash_attention_2, packed documents reach the model as one row of the whole micro-batch
    (FA2's varlen path reads document bounds from position ids only at batch size 1). The same
    flattened call through sdpa gives the batch's loss: flattening loses nothing. (FA2 itself
    needs a GPU, which the test machine does not have.)"""
    from clusterfsdp.worker import train

    samples = open_samples(tmp_path, "documents").train
    assert samples is not None
    batch = samples.batch(0, 0, 1, 3)
    spec = S.loads('[model]\nattn_implementation = "flash_attention_2"\n[data]\npacking = "documents"\n')
    model = _model("sdpa")
    shapes = []

    def record(_module, _args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))

    model.model.register_forward_pre_hook(record, with_kwargs=True)
    with torch.no_grad():
        flat = train._loss_fn(spec)(model, batch)
        rows = train._loss_fn(S.loads("[model]\nattn_implementation = 'sdpa'\n"))(model, batch)
    assert shapes == [(1, 3 * SEQ), (3, SEQ)]
    torch.testing.assert_close(flat, rows, rtol=1e-5, atol=1e-4)


OVERLONG_DOCS = ["abcdefghij" * 30, "short one", "k" * 100, "m" * 50, "n" * 30]  # positions 300, 9, 100, 50, 30


@pytest.mark.parametrize(
    ("policy", "samples", "counts"),
    [
        # in stream order, next-fit, a full piece a sample of its own: 4 x 64, 44+9, 64, 36, 50, 30
        ("split", 9, {"split": 2, "truncated": 0, "dropped": 0}),
        ("truncate", 5, {"split": 0, "truncated": 2, "dropped": 0}),  # 64, 9, 64, 50, 30
        ("drop", 2, {"split": 0, "truncated": 0, "dropped": 2}),  # 9+50, 30
    ],
)
def test_overlong_documents_follow_data_overlong(tmp_path, policy, samples, counts):
    """data.overlong on real text documents (byte tokens, seq_len 64): the counts and samples each
    policy gives, the trained fraction, and that a truncated document is its first seq_len + 1
    tokens."""
    data = open_samples(tmp_path, "documents", f"data.overlong={policy}", docs=OVERLONG_DOCS)
    train = data.train
    assert isinstance(train, datamod.PreparedSamples)
    meta = train.meta
    assert train.count == samples and meta["policy"] == policy
    assert meta["overlong"] == {"overlong": 2, **counts}
    kept = {"split": 300 + 9 + 100 + 50 + 30, "truncate": 64 + 64 + 9 + 50 + 30, "drop": 9 + 50 + 30}[policy]
    assert meta["trained"] == pytest.approx(kept / (samples * SEQ)) == pytest.approx(1 - meta["padding"])
    assert meta["lengths"] == {"min": 10, "median": 51, "p95": 261, "max": 301}
    got = all_samples(train)
    assert sum(int((g.labels != IGNORE_INDEX).sum()) for g in got) == kept
    if policy == "truncate":
        first = [g for g in got if g.input_ids[0] == ord("a")]
        assert len(first) == 1 and bytes(first[0].input_ids.astype(np.uint8)) == OVERLONG_DOCS[0][:SEQ].encode()
        assert bytes(first[0].labels.astype(np.uint8)) == OVERLONG_DOCS[0][1 : SEQ + 1].encode()


def test_overlong_names_its_own_index_and_leaves_concat_alone(tmp_path):
    from clusterfsdp.data.samplesets import index_id

    def spec(*extra: str) -> S.JobSpec:
        return S.loads('[data]\nsource = "files"\npaths = ["x.jsonl"]\n', list(extra))

    documents_split = index_id(spec("data.packing=documents"), "train")
    assert index_id(spec("data.packing=documents", "data.overlong=drop"), "train") != documents_split
    assert index_id(spec("data.packing=documents", "data.overlong=split"), "train") == documents_split
    assert index_id(spec("data.packing=concat", "data.overlong=drop"), "train") == index_id(
        spec("data.packing=concat"), "train"
    )


def test_data_overlong_drop_leaving_too_few_samples_says_to_keep_them_not_to_shrink_the_batch(tmp_path):
    """The refusal named 'lower data.seq_len' as a way out (issue 40's cross product), which
    drops more: it names data.overlong and a longer seq_len, and how many documents were left out."""
    from clusterfsdp.data.sources import DataError

    with pytest.raises(DataError) as e:
        open_samples(tmp_path, "documents", "data.overlong=drop", "slurm.tasks_per_node=2", docs=["x" * 200] * 6)
    assert str(e.value) == (
        "data.paths: the train data gives 0 samples of seq_len 64 (documents packing), fewer than one global batch "
        "(2 ranks x 2 x 1 accumulation) = 4: set data.overlong = 'split' or raise data.seq_len (6 longer documents "
        "left out)"
    )
