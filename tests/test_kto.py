"""KTO (train.objective = 'kto' on data.format = 'unpaired'; issue 37).

The loss, rewards and KL estimate are checked against TRL 1.16's own `KTOTrainer._compute_loss`
(loss_type 'kto', precomputed reference log-probs), called unbound on a namespace of the
attributes it reads, on the same tiny Llama's log-probs: TRL's model is the one boundary stubbed
(its trainer calls it with `fused_lm_head=True` and reads per-token `log_probs`, which the stub
returns as the rows' summed log-probs computed here by the real model; a full KTOTrainer needs an
accelerate set-up). Unpaired records are prepared like pairs (two rows: the completion, the KL
row), shown by `data show` and refused by `validate` / `data prepare` with the file and line.
The run is real: 2 gloo ranks, FSDP2 full fine-tune, the first loss 0.5 (policy = reference,
so every log-ratio and the KL estimate are 0 and each example's loss is 1 - σ(0)), a resume on
the same world size bitwise and on 1 rank with grad_accum 2 exact to rounding.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from data_helpers import WORDS, make_tokenizer, write_jsonl
from procs import make_run, run_workers, tiny_job_toml
from test_preference import _pairs_batch, _rows_by_attempt

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.trainer.kto_trainer import KTOTrainer as _KTOTrainer

from clusterfsdp import cli
from clusterfsdp.core import ckptfolder
from clusterfsdp.core import spec as S
from clusterfsdp.worker import kto, preference

KTOTrainer: Any = _KTOTrainer
UNPAIRED = '[data]\nsource = "files"\npaths = ["u.jsonl"]\nformat = "unpaired"\ntokenizer = "bytes"\n'


def _spec(keys: dict[str, float]) -> S.JobSpec:
    knobs = "".join(f"{k} = {v}\n" for k, v in keys.items())
    return S.loads(f'{UNPAIRED}[train]\nobjective = "kto"\n[train.preference]\n{knobs}')


def _trl(spec: S.JobSpec, logps, ref, kl_logps, ref_kl, desirable) -> tuple[torch.Tensor, dict]:
    """TRL's KTO loss (a mean over the batch) and metrics on these summed log-probs."""
    p, n, width = spec.train.preference, len(logps), 4

    def model(input_ids, **_):  # the KL rows are one token wider: that tells the two calls apart
        sums = kl_logps if input_ids.shape[1] == width + 1 else logps
        per_token = torch.zeros(n, input_ids.shape[1] - 1)
        per_token[:, -1] = sums
        return SimpleNamespace(log_probs=per_token, entropy=torch.zeros_like(per_token), mean_logits=per_token)

    model_ns: Any = SimpleNamespace(training=True)
    trainer: Any = SimpleNamespace(
        model=model_ns, accelerator=SimpleNamespace(device=torch.device("cpu"), gather_for_metrics=lambda x: x),
        calculate_KL=True, precompute_ref_logps=True, loss_type="kto", beta=p.beta,
        desirable_weight=p.desirable_weight, undesirable_weight=p.undesirable_weight, aux_loss_enabled=False,
        _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1,
    )  # fmt: skip
    trainer._compute_kl_logps = lambda m, batch: KTOTrainer._compute_kl_logps(trainer, model, batch)
    ones = torch.ones(n, width, dtype=torch.long)
    kl_ones = torch.ones(n, width + 1, dtype=torch.long)
    batch = {
        "input_ids": ones, "attention_mask": ones, "completion_mask": ones, "KL_input_ids": kl_ones,
        "KL_attention_mask": kl_ones, "KL_completion_mask": kl_ones, "label": desirable,
        "ref_logps": ref, "ref_KL_logps": ref_kl,
    }  # fmt: skip
    loss = KTOTrainer._compute_loss(trainer, model, batch, return_outputs=False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


@pytest.mark.parametrize(
    "keys, kl_shift",
    [
        ({}, (0.3, 0.5, -0.1)),  # the KL estimate 0.233
        ({"beta": 0.5, "desirable_weight": 1.3, "undesirable_weight": 0.7}, (0.3, 0.5, -0.1)),
        ({"beta": 2.0}, (-0.3, 0.1, -0.4)),  # a negative mean: clamped to 0
    ],
)
def test_kto_loss_rewards_and_kl_equal_trls(keys, kl_shift):
    model, batch = _pairs_batch()  # three examples: rows 0-2 their completions, rows 3-5 their KL rows
    batch.desirable = torch.tensor([True, False, True])
    spec = _spec(keys)
    with torch.no_grad():
        logps, _ = preference.sequence_logps(model, batch)
    completion, kl_rows = logps.chunk(2)
    ref = completion - torch.tensor([0.4, -0.2, 0.1])
    ref_kl = kl_rows - torch.tensor(kl_shift)
    table = preference.ReferenceTable(np.arange(3), torch.stack([ref, ref_kl], 1).double().numpy())
    ours = kto.KTOLoss(spec, table, lora=False)
    with torch.no_grad():
        loss = ours(model, batch)
    row = ours.row(None)
    want, metrics = _trl(spec, completion, ref, kl_rows, ref_kl, batch.desirable)
    assert loss.item() / 3 == pytest.approx(want.item(), abs=1e-6)
    assert row["kl"] == pytest.approx(metrics["kl"], abs=1e-6) and row["kl"] == pytest.approx(
        max(0.0, sum(kl_shift) / 3), abs=1e-6
    )
    for name in ("chosen", "rejected", "margins"):
        assert row[f"reward_{name.removesuffix('s')}"] == pytest.approx(metrics[f"rewards/{name}"], abs=1e-6)


def test_kto_with_lora_takes_the_base_as_reference_and_starts_at_a_half():
    """With LoRA the reference is the model with its adapters off (no table): at the start (B = 0)
    every log-ratio and the KL estimate are 0, so each example's loss is 1 - σ(0) = 0.5 whatever
    its label; once the adapters move, the KL estimate is that of the adapted model."""
    from peft import LoraConfig, get_peft_model

    model, batch = _pairs_batch()
    batch.desirable = torch.tensor([False, True, True])
    lora = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    ours = kto.KTOLoss(_spec({}), None, lora=True)
    with torch.no_grad():
        assert ours(lora, batch).item() == pytest.approx(1.5, abs=1e-6)
        assert ours.row(None)["kl"] == 0
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.add_(0.05)
        ours.reset()
        ours(lora, batch)
        adapted, _ = preference.sequence_logps(lora, kto.rows(batch, 1))
        with preference.adapters_disabled(lora):
            base, _ = preference.sequence_logps(lora, kto.rows(batch, 1))
    assert ours.row(None)["kl"] == pytest.approx(max(0.0, float((adapted - base).mean())), abs=1e-6)


# ---------------------------------------------------------------- data: prepared, shown, refused
def _job(tmp: Path, *extra: str) -> Path:
    path = tmp / "job.toml"
    path.write_text(
        f'[job]\nrun_root = "{tmp}"\n{UNPAIRED}seq_len = 48\ncache_dir = "{tmp / "cache"}"\n'
        '[train]\nobjective = "kto"\nmicro_batch_size = 2\n' + "".join(f"{line}\n" for line in extra)
    )
    return path


def test_unpaired_records_are_prepared_shown_and_refused(tmp_path, capfd):
    write_jsonl(tmp_path / "u.jsonl", [
        {"prompt": f"Q{i}: sky? ", "completion": "blue" if i % 2 else "green!", "label": bool(i % 2)} for i in range(6)
    ])  # fmt: skip
    job = _job(tmp_path)
    assert cli.main(["data", "show", str(job), "-n", "6"]) == 2  # not prepared yet
    assert cli.main(["data", "prepare", str(job)]) == 0
    assert (
        "train samples: 6 of seq_len 48 (pairs packing), 12 documents, 3 desirable and 3 undesirable examples"
        in capfd.readouterr().out
    )
    assert cli.main(["data", "show", str(job), "-n", "6"]) == 0
    shown = capfd.readouterr().out
    # each example: its completion (the label shown), then its prompt with the example before it's completion
    assert (
        "-- desirable completion --\nQ3: sky? [[blue<eos>]]\n-- KL row (another's completion) --\nQ3: sky? [[green!"
        in shown
    )
    assert (
        "-- undesirable completion --\nQ0: sky? [[green!<eos>]]\n-- KL row (another's completion) --\nQ0: sky? [[blue"
        in shown
    )

    missing = "u.jsonl:1: no 'completion' key (data.completion_key; the record has: answer, label, prompt)"
    for record, said in [
        ({"prompt": "a", "answer": "b", "label": True}, missing),
        ({"prompt": "a", "completion": "b", "label": "yes"}, "u.jsonl:1: 'label' is str 'yes', not true or false"),
        ({"prompt": "a", "completion": "b", "label": 1}, "u.jsonl:1: 'label' is int '1', not true or false (data."),
    ]:
        write_jsonl(tmp_path / "u.jsonl", [record])
        assert cli.main(["validate", str(job)]) == 2
        assert said in capfd.readouterr().err, record
    write_jsonl(tmp_path / "u.jsonl", [{"prompt": f"p{i}", "completion": "c", "label": True} for i in range(6)])
    assert cli.main(["data", "prepare", str(job)]) == 2
    assert (
        "all 6 unpaired examples are desirable: train.objective = 'kto' needs undesirable (label false) examples too"
        in capfd.readouterr().err
    )
    refusals = {
        "data.format=preference": (
            "train.objective: 'kto' trains on unpaired examples: set data.source = 'files' and data.format = 'unpaired'"
        ),
        "data.prompt_key=''": "u.jsonl:1: format 'unpaired' reads a prompt: set data.prompt_key to its field",
        "train.objective=dpo": "train.objective: 'dpo' trains on preference pairs",
        "train.objective=sft": "data.format: 'unpaired' examples train with train.objective = 'kto'",
        "train.preference.desirable_weight=0": "train.preference.desirable_weight: must be a number > 0, found 0.0",
        "train.preference.undesirable_weight=2 train.objective=dpo data.format=preference": (
            "train.preference.undesirable_weight: applies to 'kto' only, not 'dpo' (remove it)"
        ),
        "train.preference.label_smoothing=0.1": "applies to 'dpo' and 'simpo' only, not 'kto'",
        "checkpoint.keep_best=eval_reward_accuracy eval.fraction=0.5": (
            "checkpoint.keep_best: 'eval_reward_accuracy' needs a pair objective"
        ),
    }
    for sets, line in refusals.items():
        assert line in _validate_refuses(job, sets.split(), capfd), sets


def _validate_refuses(job: Path, sets: list[str], capfd) -> str:
    """What `validate --set ...` says on stderr (it must refuse: exit 2)."""
    assert cli.main(["validate", str(job), *(a for kv in sets for a in ("--set", kv))]) == 2
    return capfd.readouterr().err


# ---------------------------------------------------------------- a run (2 gloo ranks)
def test_kto_starts_at_a_half_logs_its_metrics_and_resumes_exactly(tmp_path, capsys):
    """A full fine-tune (FSDP2, 2 ranks): the reference log-probs of the completions and the KL
    rows are computed once before step 1 (so its loss is 0.5, the KL estimate 0); the desirable
    rewards rise above the undesirable ones; a resume from step 2 on 2 ranks is bitwise, and on
    1 rank with grad_accum 2 (the same global batch: the KL estimate is over the whole step)
    exact to float rounding."""
    rng = random.Random(3)
    records = []
    for _ in range(96):
        good = rng.random() < 0.5
        records.append({"prompt": " ".join(rng.choices(WORDS, k=3)) + "?", "completion": " yes" if good else " no",
                        "label": good})  # fmt: skip
    write_jsonl(tmp_path / "u.jsonl", records)
    job = tiny_job_toml(
        "kto", seed=2, steps=4, tail="[slurm]\ntasks_per_node = 2\n[checkpoint]\nevery_steps = 2\nkeep_last = 5\n"
        "[eval]\nfraction = 0.2\nevery_steps = 2\nbatches = 2\n",
    )  # fmt: skip
    data = (
        f'source = "files"\npaths = ["{tmp_path / "u.jsonl"}"]\nformat = "unpaired"\ntokenizer = "bytes"\n'
        f'seq_len = 32\ncache_dir = "{tmp_path / "cache"}"\n'
    )
    job = job.replace(job[job.index("[data]") : job.index("[train]")], f"[data]\n{data}")
    job = job.replace("[train]\n", '[train]\nobjective = "kto"\nwarmup = 0\n').replace("warmup = 2\n", "")
    run = make_run(job, tmp_path / "runs", ["train.lr=1e-2", "train.micro_batch_size=4"])
    first = run_workers(run, 2, job_id="k1")
    assert "reference log-probs of the train pairs: " in first[0][1]
    rows = {r["step"]: r for r in run.metrics()}
    assert rows[1]["loss"] == pytest.approx(0.5, abs=1e-6) and rows[1]["kl"] == 0, rows[1]
    assert rows[1]["reward_chosen"] == pytest.approx(0, abs=1e-5)
    # (both completions follow any prompt here: the KL rows' likelihood rises too, the estimate > 0)
    assert rows[4]["reward_margin"] > rows[2]["reward_margin"] > 0 and rows[4]["loss"] < 0.5, rows[4]
    assert rows[4]["eval_reward_margin"] > rows[2]["eval_reward_margin"] > 0 and "eval_ppl" not in rows[4], rows[4]
    assert rows[2]["kl"] > 0 and math.isfinite(rows[4]["kl"]) and rows[4]["eval_kl"] > 0
    # reference = 'live' (a frozen copy of the starting model): the same reference, the same numbers
    overrides = ["train.lr=1e-2", "train.micro_batch_size=4", "train.preference.reference=live"]
    live = make_run(job, tmp_path / "live", overrides)
    logs = run_workers(live, 2, job_id="k0")
    assert "reference: live, a frozen copy" in logs[0][1] and not (live.checkpoints_dir() / "reference").exists()
    lived = {r["step"]: r for r in live.metrics()}
    keys = ("loss", "kl", "reward_chosen", "reward_rejected", "eval_loss", "eval_kl")
    assert [k for k in keys if k in lived[2]] == [k for k in keys if k in rows[2]] == list(keys)
    assert all(
        lived[s][k] == pytest.approx(rows[s][k], rel=1e-5, abs=1e-6) for s in rows for k in keys if k in rows[s]
    ), {s: {k: (lived[s].get(k), rows[s].get(k)) for k in keys} for s in rows}
    capsys.readouterr()
    assert cli.main(["status", str(run.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)  # exp of a KTO loss is no perplexity
    assert (doc["kl"], doc["reward_margin"], doc["eval_ppl"]) == (rows[4]["kl"], rows[4]["reward_margin"], None)

    root = run.checkpoints_dir()
    ckptfolder.keep_only_up_to(root, 2)
    run_workers(run, 2, job_id="k2")
    ckptfolder.keep_only_up_to(root, 2)
    # the same global batch of 8 and the same 16 evaluated examples (the eval KL estimate: over all of them)
    spec = S.load(run.job_toml, ["slurm.tasks_per_node=1", "train.grad_accum=2", "eval.batches=4"])
    run.job_toml.write_text(S.dumps(spec))
    run_workers(run, 1, job_id="k3")
    original, same, other = _rows_by_attempt(run)
    keys = ("loss", "kl", "reward_chosen", "reward_rejected", "eval_loss", "eval_kl")
    assert sorted(same) == sorted(other) == [3, 4]
    assert all(same[s].get(k) == original[s].get(k) for s in same for k in keys), (same, original)  # bitwise
    assert all(
        other[s][k] == pytest.approx(original[s][k], rel=1e-4, abs=1e-5) for s in other for k in keys if k in other[s]
    ), (other, original)


def test_message_examples_take_the_chat_template_and_a_source_mapping(tmp_path):
    """Messages through a [[data.sources]] mapping (completion_key, label_key, ShareGPT keys): the
    completion row trains on its assistant answer only, the KL row on the previous example's."""
    from test_preference import _trained

    from clusterfsdp.data import prepare
    from clusterfsdp.data.samples import PreparedSamples
    from clusterfsdp.data.samplesets import index_id

    tok = make_tokenizer(tmp_path / "tok")
    from transformers import AutoTokenizer

    decode = AutoTokenizer.from_pretrained(tok).decode
    write_jsonl(tmp_path / "c.jsonl", [
        {"turns": [{"from": "human", "value": f"say {w}"}], "reply": [{"from": "gpt", "value": w}], "ok": k != 1}
        for k, w in enumerate(("paper", "horse", "cloud"))
    ])  # fmt: skip
    source = (
        '[[data.sources]]\npath = "c.jsonl"\nprompt_key = "turns"\ncompletion_key = "reply"\nlabel_key = "ok"\n'
        'role_key = "from"\ncontent_key = "value"\nroles = { human = "user", gpt = "assistant" }'
    )
    job = _job(tmp_path).read_text().replace('paths = ["u.jsonl"]\n', "").replace('"bytes"', f'"{tok}"')
    (tmp_path / "job.toml").write_text(job.replace("[train]", f"{source}\n[train]"))
    spec = S.load(str(tmp_path / "job.toml"))
    (ref,) = prepare.ensure(spec, lambda _: None)
    samples = PreparedSamples(ref.folder, index_id(spec, "train"), 48, 0, "train")
    assert samples.meta["desirable"] == 2 and samples.meta["undesirable"] == 1
    (row, trained), (kl_row, kl_trained) = _trained(samples, 1, decode)
    assert row.startswith("<|im_start|>user\nsay horse<|im_end|>") and kl_row.startswith(row.split("assistant")[0])
    assert (trained, kl_trained) == ("horse<|im_end|>\n", "paper<|im_end|>\n")
    assert [samples.sample(k).desirable for k in range(3)] == [True, False, True]


def test_a_last_example_alone_in_its_encode_batch_joins_the_batch_before(tmp_path, monkeypatch):
    """Records are encoded in batches of about readers.BATCH_BYTES of text; a last batch of one
    unpaired example would have no other completion for its KL row: it joins the batch before
    (the rotation then runs over all three examples)."""
    from test_preference import _trained

    from clusterfsdp.data import prepare, readers
    from clusterfsdp.data.samples import PreparedSamples
    from clusterfsdp.data.samplesets import index_id

    monkeypatch.setattr(readers, "BATCH_BYTES", 20)  # two of these records fill a batch
    write_jsonl(
        tmp_path / "u.jsonl", [{"prompt": f"p{i}: ", "completion": f"answer{i}", "label": i != 1} for i in range(3)]
    )
    spec = S.load(str(_job(tmp_path)))
    (ref,) = prepare.ensure(spec, lambda _: None)
    samples = PreparedSamples(ref.folder, index_id(spec, "train"), 48, 0, "train")

    def decode(ids):
        return bytes(i for i in ids if i < 256).decode()

    assert [kl for _, (kl, _) in (_trained(samples, k, decode) for k in range(3))] == [
        "p0: answer2", "p1: answer0", "p2: answer1"
    ]  # fmt: skip


def test_a_mixture_of_unpaired_sources_needs_both_labels_between_them(tmp_path, capfd):
    """One source may hold only desirable examples and another only undesirable ones; a mixture
    without either kind is refused by `data prepare` and `validate`."""
    for name, label in (("a", True), ("b", False)):
        write_jsonl(
            tmp_path / f"{name}.jsonl", [{"prompt": f"{name}{i}", "completion": "x", "label": label} for i in range(4)]
        )
    sources = '[[data.sources]]\npath = "a.jsonl"\n[[data.sources]]\npath = "b.jsonl"\n'
    job = _job(tmp_path)
    job.write_text(job.read_text().replace('paths = ["u.jsonl"]\n', "").replace("[train]", f"{sources}[train]"))
    assert cli.main(["data", "prepare", str(job)]) == 0 and cli.main(["validate", str(job)]) == 0
    write_jsonl(tmp_path / "b.jsonl", [{"prompt": f"b{i}", "completion": "y", "label": True} for i in range(4)])
    said = (
        "data.sources: all 8 unpaired examples of the mixture are desirable: train.objective = 'kto' needs undesirable"
    )
    capfd.readouterr()
    assert cli.main(["data", "prepare", str(job)]) == 2 and said in capfd.readouterr().err
    assert cli.main(["validate", str(job)]) == 2 and said in capfd.readouterr().err
