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
reference), a resume bitwise on the same world size and exact on another, LoRA on FSDP1.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from data_helpers import make_tokenizer, write_jsonl

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
from trl.experimental.cpo.cpo_trainer import CPOTrainer
from trl.experimental.orpo.orpo_trainer import ORPOTrainer

from clusterfsdp import cli
from clusterfsdp.control import spec as S
from clusterfsdp.data import prepare
from clusterfsdp.data.samples import PreparedSamples, Sample, stack
from clusterfsdp.data.samplesets import index_id
from clusterfsdp.data.tokens import IGNORE_INDEX
from clusterfsdp.worker import preference

CPU = SimpleNamespace(device=torch.device("cpu"))
PAIRS = '[data]\nsource = "files"\npaths = ["pairs.jsonl"]\nformat = "preference"\ntokenizer = "bytes"\n'


def _spec(objective: str, keys: dict[str, float] | None = None) -> S.JobSpec:
    knobs = "".join(f"{k} = {v}\n" for k, v in (keys or {}).items())
    return S.loads(f'{PAIRS}[train]\nobjective = "{objective}"\n[train.preference]\n{knobs}')


def _pairs_batch(seq: int = 12, vocab: int = 64) -> tuple[torch.nn.Module, object]:
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
    losses, chosen, rejected = preference.pair_losses(spec, logps.chunk(2), reference, counts.chunk(2))  # type: ignore[arg-type]
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
        "train.objective=kto": "train.objective: 'kto' is not implemented yet",
        "train.objective=sft": "data.format: 'preference' pairs train with a preference objective",
        "train.preference.label_smoothing=0.1 train.objective=ipo": "applies to 'dpo' and 'simpo' only, not 'ipo'",
        "data.format=text": "train.objective: 'dpo' trains on preference pairs",
        "data.packing=documents": "data.packing: 'documents' does not apply to preference pairs",
    }
    for sets, line in refusals.items():
        args = [a for kv in sets.split() for a in ("--set", kv)]
        assert cli.main(["validate", str(job), *args]) == 2
        assert line in capsys.readouterr().err, sets
