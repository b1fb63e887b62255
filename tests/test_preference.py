"""Preference training (train.objective 'dpo', 'ipo', 'simpo', 'orpo'; issue 37).

The losses and rewards are checked against TRL's own code (trl 1.16, a test-only dependency in
pyproject's dev extras) on the same tiny Llama, pairs and reference log-probs: the sequence
log-probs against `CPOTrainer.get_batch_logps`, dpo (with label smoothing), ipo and simpo against
`CPOTrainer.cpo_loss` (whose sigmoid with label smoothing 0 is `DPOTrainer`'s 'sigmoid' line, and
whose 'ipo' on length-averaged log-ratios is `DPOTrainer`'s 'ipo'), orpo against
`ORPOTrainer.odds_ratio_loss` plus its NLL term (the chosen answers equally long: TRL averages
that term over tokens, clusterfsdp per pair). The methods are called unbound on a namespace
holding the attributes they read (their trainers need a full accelerate set-up).

Pairs are prepared like SFT data (strings with the byte tokenizer; UltraFeedback-style messages
and Anthropic-HH-style conversations through a [[data.sources]] mapping with a chat tokenizer),
shown by `data show`, and refused by `validate` with the file, line and keys of a record. The
runs are real: 2 gloo ranks on CPU, the first DPO step's loss log 2 (the policy is its
reference), a resume bitwise on the same world size and exact on another, LoRA on FSDP1; the
in-training reference (train.preference.reference = 'live') on FSDP2 (equal to the table's
numbers, resumed bitwise), FSDP1 and HSDP.
"""

from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from data_helpers import WORDS, make_tokenizer, write_jsonl
from procs import launch, make_run, run_workers, tiny_job_toml, wait

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.cpo.cpo_trainer import CPOTrainer as _CPOTrainer
from trl.experimental.orpo.orpo_trainer import ORPOTrainer as _ORPOTrainer

from clusterfsdp import cli
from clusterfsdp.core import ckptfolder
from clusterfsdp.core import spec as S
from clusterfsdp.data import prepare
from clusterfsdp.data.samples import Batch, PreparedSamples, Sample, stack
from clusterfsdp.data.samplesets import index_id
from clusterfsdp.data.tokens import IGNORE_INDEX
from clusterfsdp.worker import objectives, preference

CPU = SimpleNamespace(device=torch.device("cpu"))
# TRL's methods, called unbound on a namespace of the attributes they read (typed for their trainers)
CPOTrainer: Any = _CPOTrainer
ORPOTrainer: Any = _ORPOTrainer
PAIRS = '[data]\nsource = "files"\npaths = ["pairs.jsonl"]\nformat = "preference"\ntokenizer = "bytes"\n'


def _spec(objective: str, keys: dict[str, float] | None = None) -> S.JobSpec:
    knobs = "".join(f"{k} = {v}\n" for k, v in (keys or {}).items())
    return S.loads(f'{PAIRS}[train]\nobjective = "{objective}"\n[train.preference]\n{knobs}')


def _pairs_batch(seq: int = 12, vocab: int = 64) -> tuple[torch.nn.Module, Batch]:
    """A tiny Llama and three pairs (chosen answers 3 tokens long, rejected ones 2 to 4), the last
    label of every row padding (so TRL's shift-inside reads the same labels)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                    num_attention_heads=2, num_key_value_heads=2)
    ).eval()  # fmt: skip
    g = torch.Generator().manual_seed(1)
    samples = []
    for k, (prompt, rejected) in enumerate([(4, 2), (6, 4), (3, 3)]):
        rows, labels = np.zeros((2, seq), np.int64), np.full((2, seq), IGNORE_INDEX, np.int64)
        for row, answer in enumerate((3, rejected)):
            ids = torch.randint(1, vocab, (prompt + answer,), generator=g).numpy()
            rows[row, : len(ids)] = ids
            labels[row, prompt - 1 : prompt + answer - 1] = ids[prompt:]
        samples.append(Sample(rows, labels, pair_id=k))
    return model, stack(samples)


def _trl_logps(model, batch, average: bool) -> torch.Tensor:
    logits = model(input_ids=batch.input_ids).logits
    unshifted = torch.cat([torch.full_like(batch.labels[:, :1], IGNORE_INDEX), batch.labels[:, :-1]], dim=1)
    return CPOTrainer.get_batch_logps(logits, unshifted, average_log_prob=average)


@pytest.mark.parametrize(
    "objective, keys",
    [
        ("dpo", {}),
        ("dpo", {"label_smoothing": 0.2}),
        ("ipo", {"beta": 0.5}),
        ("simpo", {"beta": 2.0, "simpo_gamma": 0.7, "label_smoothing": 0.1}),
        ("orpo", {"beta": 0.3}),
    ],
)
def test_losses_and_rewards_equal_trls(objective, keys):
    model, batch = _pairs_batch()
    spec = _spec(objective, keys)
    p = spec.train.preference
    with torch.no_grad():
        logps, counts = preference.sequence_logps(model, batch)
        assert torch.allclose(logps, _trl_logps(model, batch, average=False), atol=1e-5)
        averaged = _trl_logps(model, batch, average=True)
    reference = (logps[:3] - torch.tensor([0.3, -0.2, 0.1]), logps[3:] + torch.tensor([0.4, 0.05, -0.3]))
    (pc, pr), (nc, nr) = logps.chunk(2), counts.chunk(2)
    losses, chosen, rejected = preference.pair_losses(spec, (pc, pr), reference, (nc, nr))
    trl = SimpleNamespace(beta=p.beta, label_smoothing=p.label_smoothing, simpo_gamma=p.simpo_gamma, alpha=0.0,
                          accelerator=CPU, loss_type={"dpo": "sigmoid"}.get(objective, objective))  # fmt: skip
    if objective in ("dpo", "ipo"):
        c, r = logps[:3] - reference[0], logps[3:] - reference[1]
        if objective == "ipo":  # DPOTrainer's ipo: the log-ratios averaged over each answer's tokens
            c, r = c / counts[:3], r / counts[3:]
        want, _, _ = CPOTrainer.cpo_loss(trl, c, r)
        want_rewards = (p.beta * (logps[:3] - reference[0]), p.beta * (logps[3:] - reference[1]))
    elif objective == "simpo":
        want, *want_rewards = CPOTrainer.cpo_loss(trl, averaged[:3], averaged[3:])
    else:
        ratio_losses, *want_rewards, _, _ = ORPOTrainer.odds_ratio_loss(trl, averaged[:3], averaged[3:])
        nll = -averaged[:3].mean()  # TRL's token mean over the chosen answers: equal lengths here
        assert torch.allclose(losses.mean(), nll - ratio_losses.mean(), atol=1e-6)
        want = None
    if want is not None:
        assert torch.allclose(losses, want, atol=1e-6), (losses, want)
    assert torch.allclose(chosen, want_rewards[0], atol=1e-6) and torch.allclose(rejected, want_rewards[1], atol=1e-6)


def test_dpo_loss_is_log_2_when_the_policy_is_its_reference():
    model, batch = _pairs_batch()
    spec = _spec("dpo")
    with torch.no_grad():
        logps, _ = preference.sequence_logps(model, batch)
    table = preference.ReferenceTable(np.arange(3), logps.reshape(2, 3).T.double().numpy())
    loss = preference.PreferenceLoss(spec, table, lora=False)(model, batch)
    assert loss.item() / 3 == pytest.approx(math.log(2), abs=1e-6)


# ---------------------------------------------------------------- preparing pairs
def _job(tmp: Path, data: str, *extra: str) -> Path:
    path = tmp / "job.toml"
    path.write_text(
        f'[job]\nrun_root = "{tmp}"\n[data]\nsource = "files"\nformat = "preference"\nseq_len = 48\n'
        f'cache_dir = "{tmp / "cache"}"\n{data}\n[train]\nobjective = "dpo"\nmicro_batch_size = 2\n'
        + "".join(f"{line}\n" for line in extra)
    )
    return path


def _trained(samples: PreparedSamples, k: int, decode) -> list[tuple[str, str]]:
    """Pair k as (input text, trained labels' text) of its chosen and rejected rows (the inputs
    stop before a document's last token: it is only a label)."""
    batch = stack([samples.sample(k)])
    out = []
    for row in range(2):
        ids, labels = batch.input_ids[row], batch.labels[row]
        used = int((ids != samples.pad).nonzero().max()) + 1
        out.append((decode(ids[:used].tolist()), decode(labels[labels != IGNORE_INDEX].tolist())))
    return out


def test_string_pairs_are_prepared_with_the_answers_trained_and_shown(tmp_path, capfd):
    write_jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": f"Q{i}: sky? ", "chosen": "blue", "rejected": "green!", "other": 1} for i in range(8)
    ])  # fmt: skip
    job = _job(tmp_path, 'paths = ["pairs.jsonl"]\ntokenizer = "bytes"')
    spec = S.load(str(job))
    (ref,) = prepare.ensure(spec, lambda _: None)
    samples = PreparedSamples(ref.folder, index_id(spec, "train"), 48, 0, "train")
    assert samples.count == 8 and samples.meta["packing"] == "pairs"

    def decode(ids):
        return bytes(i if i < 256 else ord("$") for i in ids).decode()

    assert _trained(samples, 3, decode) == [("Q3: sky? blue", "blue$"), ("Q3: sky? green!", "green!$")]
    assert cli.main(["data", "show", str(job), "-n", "1"]) == 0
    shown = capfd.readouterr().out
    assert "-- chosen --\nQ" in shown and "[[blue<eos>]]\n-- rejected --" in shown and "[[green!<eos>]]" in shown


CHAT_PAIRS = [  # UltraFeedback's shape: a prompt string, the answers whole conversations
    {
        "prompt": f"name {w}",
        "chosen": [{"role": "user", "content": f"name {w}"}, {"role": "assistant", "content": "river"}],
        "rejected": [{"role": "user", "content": f"name {w}"}, {"role": "assistant", "content": "stone lamp"}],
    }
    for w in ("north", "garden", "silver", "window")
]
HH_PAIRS = [  # Anthropic-HH's shape: no prompt, the answers whole conversations (ShareGPT keys here)
    {
        "good": [{"from": "human", "value": f"say {w}"}, {"from": "gpt", "value": w}],
        "bad": [{"from": "human", "value": f"say {w}"}, {"from": "gpt", "value": "no"}],
    }
    for w in ("paper", "horse", "cloud", "bread")
]


def test_message_pairs_take_the_chat_template_and_source_mappings(tmp_path):
    tok = make_tokenizer(tmp_path / "tok")
    from transformers import AutoTokenizer

    decode = AutoTokenizer.from_pretrained(tok).decode
    write_jsonl(tmp_path / "uf.jsonl", CHAT_PAIRS)
    spec = S.load(str(_job(tmp_path, f'paths = ["uf.jsonl"]\ntokenizer = "{tok}"')))
    (ref,) = prepare.ensure(spec, lambda _: None)
    samples = PreparedSamples(ref.folder, index_id(spec, "train"), 48, 0, "train")
    (chosen, chosen_trained), (rejected, rejected_trained) = _trained(samples, 1, decode)
    assert chosen == "<|im_start|>user\nname garden<|im_end|>\n<|im_start|>assistant\nriver<|im_end|>"  # (inputs)
    assert chosen_trained == "river<|im_end|>\n" and rejected_trained == "stone lamp<|im_end|>\n"
    assert rejected.startswith("<|im_start|>user\nname garden<|im_end|>")

    write_jsonl(tmp_path / "hh.jsonl", HH_PAIRS)
    source = (
        '[[data.sources]]\npath = "hh.jsonl"\nchosen_key = "good"\nrejected_key = "bad"\nrole_key = "from"\n'
        'content_key = "value"\nroles = { human = "user", gpt = "assistant" }'
    )
    job = _job(tmp_path, f'tokenizer = "{tok}"\nprompt_key = ""\n{source}')
    spec = S.load(str(job))
    (ref,) = prepare.ensure(spec, lambda _: None)
    samples = PreparedSamples(ref.folder, index_id(spec, "train"), 48, 0, "train")
    (chosen, chosen_trained), (_, rejected_trained) = _trained(samples, 2, decode)
    assert chosen.startswith("<|im_start|>user\nsay cloud<|im_end|>")
    assert (chosen_trained, rejected_trained) == ("cloud<|im_end|>\n", "no<|im_end|>\n")


def test_validate_names_a_records_missing_key_and_refuses_unfinished_objectives(tmp_path, capsys):
    write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "a", "chosen": "b", "answer": "c"}])
    job = _job(tmp_path, 'paths = ["pairs.jsonl"]\ntokenizer = "bytes"')
    assert cli.main(["validate", str(job)]) == 2
    said = capsys.readouterr().err
    assert "pairs.jsonl:1: no 'rejected' key (data.rejected_key; the record has: answer, chosen, prompt)" in said
    refusals = {
        "train.objective=kto": "train.objective: 'kto' trains on unpaired examples: set data.source",
        "train.objective=sft": "data.format: 'preference' pairs train with a preference objective",
        "train.preference.label_smoothing=0.1 train.objective=ipo": "applies to 'dpo' and 'simpo' only, not 'ipo'",
        "data.format=text": "train.objective: 'dpo' trains on preference pairs",
        "data.packing=documents": "data.packing: 'documents' does not apply to preference pairs",
        "train.objective=simpo train.preference.reference=live": (
            "train.preference.reference: 'live' applies to 'dpo', 'ipo' and 'kto' only; 'simpo' uses no reference model"
        ),
        "train.objective=orpo train.preference.reference=live": "'orpo' uses no reference model (remove it)",
        "checkpoint.keep_best=eval_reward_accuracy train.early_stopping.metric=eval_loss eval.fraction=0.5": (
            "train.early_stopping.metric: the run judges its evaluations by checkpoint.keep_best = "
        ),
    }
    for sets, line in refusals.items():
        args = [a for kv in sets.split() for a in ("--set", kv)]
        assert cli.main(["validate", str(job), *args]) == 2
        assert line in capsys.readouterr().err, sets


# ---------------------------------------------------------------- training runs (2 gloo ranks)
def _word_pairs(n: int, seed: int) -> list[dict]:
    """Pairs whose preference holds for every prompt (held-out reward accuracy can rise)."""
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choices(WORDS, k=3)) + "?", "chosen": " yes", "rejected": " no"} for _ in range(n)]


def _pair_run(tmp: Path, objective: str, fsdp: str, tail: str, *overrides: str):
    write_jsonl(tmp / "pairs.jsonl", _word_pairs(96, seed=3))
    job = tiny_job_toml("pref", seed=2, steps=4, fsdp=fsdp, tail=tail)
    data = (
        f'source = "files"\npaths = ["{tmp / "pairs.jsonl"}"]\nformat = "preference"\ntokenizer = "bytes"\n'
        f'seq_len = 32\ncache_dir = "{tmp / "cache"}"\n'
    )
    job = job.replace(job[job.index("[data]") : job.index("[train]")], f"[data]\n{data}")
    job = job.replace("[train]\n", f'[train]\nobjective = "{objective}"\nwarmup = 0\n').replace("warmup = 2\n", "")
    return make_run(job, tmp / "runs", ["train.lr=1e-2", *overrides])


def test_dpo_starts_at_log_2_evaluates_held_out_pairs_resumes_exactly_and_exports(tmp_path, capsys):
    """A full fine-tune (FSDP2, 2 ranks): the reference log-probs are computed once before the
    first step (so its loss is log 2) and read by every resume; the held-out reward accuracy
    rises above the reference's (0: equal rewards), and keep_best keeps its best step (the first
    of the highest: step 2 here, where the eval loss is lowest at step 4); a resume from step 2
    on 2 ranks is bitwise, on 1 rank exact to float rounding; the export loads in transformers."""
    run = _pair_run(
        tmp_path, "dpo", "", "[slurm]\ntasks_per_node = 2\n[checkpoint]\nevery_steps = 2\nkeep_last = 5\n"
        'keep_best = "eval_reward_accuracy"\n'
        "[eval]\nfraction = 0.2\nevery_steps = 2\nbatches = 2\n",
    )  # fmt: skip
    first = run_workers(run, 2, job_id="d1")
    assert (
        "reference log-probs of the train pairs: " in first[0][1] and " computed by the starting model" in first[0][1]
    )
    assert "loss: lm_head fused with the loss" in first[0][1]  # FSDP2: the chunked per-row log-probs
    rows = {r["step"]: r for r in run.metrics()}
    assert rows[1]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert rows[1]["reward_chosen"] == pytest.approx(0, abs=1e-5) and rows[1]["reward_accuracy"] == 0
    assert rows[4]["eval_reward_accuracy"] > 0.9 and rows[4]["eval_reward_margin"] > 0, rows[4]
    assert "eval_ppl" not in rows[4]  # exp of a pair loss is no perplexity
    assert rows[4]["reward_margin"] > 0 and rows[4]["reward_accuracy"] == 1 and rows[4]["loss"] < math.log(2)
    root = run.checkpoints_dir()
    assert ckptfolder.reference_file(root, "train").is_file() and ckptfolder.reference_file(root, "eval").is_file()
    accuracy = [(rows[s]["eval_reward_accuracy"], -s) for s in (2, 4)]  # the first of the highest
    best = ckptfolder.best(root)
    assert best is not None and best.step == -max(accuracy)[1] == 2 and rows[4]["eval_loss"] < rows[2]["eval_loss"]
    capsys.readouterr()
    assert cli.main(["status", str(run.path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["reward_accuracy"], doc["eval_reward_accuracy"]) == (1, rows[4]["eval_reward_accuracy"])
    assert doc["eval_loss"] == rows[4]["eval_loss"] and doc["eval_ppl"] is None

    ckptfolder.keep_only_up_to(root, 2)
    again = run_workers(run, 2, job_id="d2")  # the same world size: bitwise
    assert "reference log-probs of the train pairs: read 80 from" in again[0][1]
    ckptfolder.keep_only_up_to(root, 2)
    spec = S.load(run.job_toml, ["slurm.tasks_per_node=1", "train.micro_batch_size=4"])  # same global batch
    run.job_toml.write_text(S.dumps(spec))
    run_workers(run, 1, job_id="d3")
    original, same, other = _rows_by_attempt(run)
    keys = ("loss", "reward_margin", "eval_loss", "eval_reward_margin")
    assert sorted(same) == sorted(other) == [3, 4]
    assert all(same[s].get(k) == original[s].get(k) for s in same for k in keys), (same, original)  # bitwise
    assert all(
        other[s][k] == pytest.approx(original[s][k], rel=1e-4, abs=1e-5) for s in other for k in keys if k in other[s]
    )

    assert cli.main(["export", str(run.path), "--to", str(tmp_path / "out")]) == 0
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "out")
    assert torch.isfinite(model(torch.tensor([[72, 105]])).logits).all()


def test_live_reference_is_the_starting_model_frozen_and_rebuilt_by_a_resume(tmp_path):
    """train.preference.reference = 'live' (FSDP2, 2 ranks): a frozen second copy of the starting
    model, sharded like the policy, its log-probs computed each micro-batch (the fused path).
    Both references are the starting model, so every step's loss and rewards (train and eval)
    equal a reference = 'start' run's on the same pairs: a copy that trained, shared the policy's
    parameters or started elsewhere would drift from it. No table is kept; a resume from step 2
    rebuilds the copy (not in the checkpoint) and continues bitwise."""
    tail = "[slurm]\ntasks_per_node = 2\n[checkpoint]\nevery_steps = 2\nkeep_last = 5\n"
    tail += "[eval]\nfraction = 0.2\nevery_steps = 2\nbatches = 2\n"
    runs = {}
    for mode in ("live", "start"):
        (tmp_path / mode).mkdir()
        runs[mode] = _pair_run(tmp_path / mode, "dpo", "", tail, f"train.preference.reference={mode}")
        out = run_workers(runs[mode], 2, job_id=mode)
        said = out[0][1]
        assert (
            "reference: live, a frozen copy of the starting model sharded like the policy (fused log-probs" in said
        ) == (mode == "live") and ("reference log-probs of the train pairs" in said) == (mode == "start")
    live, start = ({r["step"]: r for r in runs[m].metrics()} for m in ("live", "start"))
    assert live[1]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert min(live[s]["loss"] for s in (2, 3, 4)) < math.log(2) - 0.1  # the policy moved away from its reference
    keys = ("loss", "reward_chosen", "reward_rejected", "reward_margin", "eval_loss", "eval_reward_margin")
    assert sorted(live) == sorted(start) == [1, 2, 3, 4]
    for s in live:
        assert {k: live[s].get(k) for k in keys} == pytest.approx(
            {k: start[s].get(k) for k in keys}, rel=1e-5, abs=1e-6
        ), (s, live[s], start[s])
    root = runs["live"].checkpoints_dir()
    assert not any(ckptfolder.reference_file(root, role).exists() for role in ("train", "eval"))
    ckptfolder.keep_only_up_to(root, 2)
    again = run_workers(runs["live"], 2, job_id="live2")
    assert "reference: live" in again[0][1]
    original, resumed = _rows_by_attempt(runs["live"])
    assert sorted(resumed) == [3, 4]
    assert all(resumed[s].get(k) == original[s].get(k) for s in resumed for k in keys), (resumed, original)  # bitwise


def test_live_reference_on_fsdp1(tmp_path):
    """reference = 'live' on FSDP1 (2 ranks, full shard): the frozen copy is wrapped like the policy
    (its units flattened with requires_grad False) and read through the full logits; the first
    loss is log 2 (the copy is the starting policy), then the loss falls and the margin rises (a
    reference that followed the policy would keep log 2 and a zero margin)."""
    run = _pair_run(tmp_path, "dpo", 'version = 1\nsharding = "full"', "[slurm]\ntasks_per_node = 2\n",
                    "train.preference.reference=live")  # fmt: skip
    out = run_workers(run, 2, job_id="f1")
    assert "reference: live, a frozen copy of the starting model sharded like the policy (" in out[0][1]
    assert "FSDP1" in out[0][1] and "reference log-probs" not in out[0][1]
    rows = {r["step"]: r for r in run.metrics()}
    assert rows[1]["loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert min(rows[s]["loss"] for s in (2, 3, 4)) < math.log(2) - 0.1, rows  # a reference = the policy: log 2
    assert max(rows[s]["reward_margin"] for s in (2, 3, 4)) > 0.3, rows


LIVE_CHECK = r"""
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.tensor import DTensor
from clusterfsdp.core import spec as S
from clusterfsdp.data.samples import Batch
from clusterfsdp.worker import build as buildmod, distenv, preference

os.environ.update(distenv.from_environ().export())
dist.init_process_group("gloo")
cpu, world = torch.device("cpu"), dist.get_world_size()
spec = S.loads(sys.argv[1])
policy, _, _ = buildmod.build_model(spec, cpu, world, buildmod.token_ids(spec))
shape = lambda m: [(n, p.device_mesh.mesh_dim_names, p.placements, p.to_local().shape) for n, p in m.named_parameters()]
sharded = shape(policy)  # (before its forward: FSDP2 keeps the root gathered after one)
torch.manual_seed(7)
rng = torch.random.get_rng_state()
live = preference.build_live(spec, cpu, world, None, print)
ids = torch.arange(24).reshape(2, 12) * 5 % 250
labels = torch.where(torch.arange(12) > 6, ids.roll(-1, 1), -100)
batch = Batch(ids, labels, pair_ids=torch.tensor([0]))
reference = preference.PreferenceLoss(spec, None, False, live).reference_logps(policy, batch)
resharded = all(isinstance(p, DTensor) for p in live.parameters())
with torch.no_grad():
    start = preference.sequence_logps(policy, batch)[0]
print("RESULT " + json.dumps({
    "rng_kept": torch.equal(rng, torch.random.get_rng_state()),
    "frozen": not live.training and not any(p.requires_grad for p in live.parameters()),
    "resharded": resharded,
    "sharded_like_the_policy": resharded and shape(live) == sharded,
    "fused": hasattr(live, "clusterfsdp_logps"),
    "same_logps": torch.equal(torch.cat(reference), start),
    "meshes": sorted({str(p.device_mesh.mesh_dim_names) for p in live.parameters()}) if resharded else None,
}), flush=True)
dist.destroy_process_group()
"""


def test_live_reference_is_built_like_the_policy_on_hsdp():
    """build_live on HSDP (2 ranks as 2 nodes x 1): the frozen copy's parameters are placed on the
    policy's 2-D mesh exactly as the policy's, frozen and in eval mode, with the fused log-probs;
    its log-probs of a pair are the starting policy's; after its forward every unit is sharded
    again (FSDP2 keeps the root and last layer gathered after a forward for the backward the
    reference never runs); and building it leaves the global RNG as it was (its init reseeds it,
    and a resume builds it after restoring the checkpoint's RNG)."""
    text = (
        f'{PAIRS}seq_len = 16\n[model]\npreset = "llama-tiny"\n[train]\nobjective = "dpo"\n'
        '[train.preference]\nreference = "live"\n[fsdp]\nsharding = "hybrid"\nmixed_precision = "fp32"\n'
        "[slurm]\nnodes = 2\ntasks_per_node = 1\n"
    )
    out = wait(launch(["-c", LIVE_CHECK, text], 2))
    assert all(code == 0 for code, _ in out), "\n".join(t[-3000:] for _, t in out)
    for _, said in out:
        got = json.loads(said.split("RESULT ", 1)[1].splitlines()[0])
        expected = {"rng_kept": True, "frozen": True, "resharded": True, "sharded_like_the_policy": True,
                    "fused": True, "same_logps": True, "meshes": ["('replicate', 'shard')"]}  # fmt: skip
        assert got == expected, said[-2000:]


def _rows_by_attempt(run) -> list[dict[int, dict]]:
    """The metrics rows of each attempt, step -> row (a new attempt starts where a step repeats)."""
    attempts: list[dict[int, dict]] = [{}]
    for row in run.metrics():
        if "step" not in row:
            continue
        if attempts[-1] and row["step"] <= max(attempts[-1]):
            attempts.append({})
        attempts[-1].setdefault(row["step"], {}).update(row)
    return attempts


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny Llama for the byte tokenizer, written by save_pretrained (LoRA needs a pretrained base)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from clusterfsdp.core.presets import PRESETS

    folder = tmp_path_factory.mktemp("base") / "llama"
    torch.manual_seed(1)
    keys = {k: v for k, v in PRESETS["llama-tiny"].items() if k != "model_type"}
    AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **keys)).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("objective", ["dpo", "simpo"])
def test_lora_preference_on_fsdp1_uses_the_base_as_reference(tmp_path, base, objective):
    """LoRA on FSDP1: dpo's reference is the base with the adapters disabled (no table, no second
    model; the adapters start at zero, so the first loss is log 2), which train.preference.reference
    = 'live' accepts as its own (said in the log); simpo needs no reference.
    Both raise the reward margin; dpo's resume from step 2 is bitwise."""
    lora = '[peft]\nmethod = "lora"\nr = 4\nalpha = 8\n[slurm]\ntasks_per_node = 2\n'
    lora += "[checkpoint]\nevery_steps = 2\nkeep_last = 5\n"
    live = ["train.preference.reference=live"] if objective == "dpo" else []  # accepted: what LoRA does anyway
    run = _pair_run(tmp_path, objective, 'version = 1\nsharding = "full"', lora, f"model.name_or_path={str(base)!r}",
                    "model.preset=''", *live)  # fmt: skip
    out = run_workers(run, 2, job_id="l1")
    assert "reference log-probs" not in out[0][1] and "FSDP1" in out[0][1]
    said = "reference: live: with LoRA the base with the adapters disabled (no second model, no table)"
    assert (said in out[0][1]) == (objective == "dpo") and "a frozen copy" not in out[0][1]
    rows = {r["step"]: r for r in run.metrics()}
    assert rows[4]["reward_margin"] > rows[1]["reward_margin"], rows
    assert not ckptfolder.reference_file(run.checkpoints_dir(), "train").exists()
    if objective == "dpo":
        assert rows[1]["loss"] == pytest.approx(math.log(2), abs=1e-5)
        ckptfolder.keep_only_up_to(run.checkpoints_dir(), 2)
        run_workers(run, 2, job_id="l2")
        original, again = _rows_by_attempt(run)
        assert all(again[s]["loss"] == original[s]["loss"] for s in (3, 4)), (again, original)  # bitwise
        assert all(again[s]["reward_margin"] == original[s]["reward_margin"] for s in (3, 4))


def test_a_reference_table_of_other_pairs_is_refused(tmp_path):
    """Pair ids mean nothing in other data: a resume that reads other pairs (the data, seq_len or
    split changed) stops with one line instead of reading wrong reference log-probs."""
    spec = _spec("dpo")
    table = preference.ReferenceTable(np.arange(2), np.zeros((2, 2)), "abc/0123")
    table.save(ckptfolder.reference_file(tmp_path, "train"))

    def start(index: str) -> preference.Objectives:
        samples = SimpleNamespace(parts=[SimpleNamespace(identity=f"abc/{index}")])
        return objectives.start(spec, None, {"train": samples}, tmp_path, True, 0, 1, torch.device("cpu"), print,
                                lora=False)  # fmt: skip

    assert start("0123").train.reference is not None
    with pytest.raises(RuntimeError, match=r"computed over other train pairs \(abc/0123; this attempt reads abc/4567"):
        start("4567")


def test_pairs_too_long_for_seq_len_are_refused_with_a_longer_seq_len():
    """Pairs are never split: a sample set emptied by long pairs asks for a longer seq_len (the
    documents' advice, data.overlong = 'split', is already what pairs read)."""
    from clusterfsdp.data import mixture, samplesets

    spec = S.loads(PAIRS + '[train]\nobjective = "dpo"\n', ["data.seq_len=16"])
    meta = {"samples": 0, "overlong": {"overlong": 5, "dropped": 5}}
    said = samplesets.batch_problem(spec, "train", 0, meta)
    assert said and said.endswith(
        "raise data.seq_len (5 pairs left out: longer than seq_len, an answer cut off or 'drop')"
    )
    mixed = '[data]\nsource = "files"\nformat = "preference"\ntokenizer = "bytes"\n[[data.sources]]\npath = "p.jsonl"\n'
    said = mixture.part_problem(S.loads(mixed + '[train]\nobjective = "dpo"\n'), "train", 0, meta)
    assert said and "(5 pairs left out" in said and said.endswith(": raise data.seq_len"), said
