"""Chat fine-tuning (data.format = 'chat'): the tokenizer's chat template (ChatML, no
{% generation %} markers) renders each conversation, only assistant tokens are trained on, the
prompt tokens contribute exactly zero gradient, and a real run on random prompts with a fixed
answer drives the loss (and the held-out eval loss) to about zero."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from data_helpers import conversations, make_tokenizer, write_jsonl
from procs import make_run, run_workers

from clusterfsdp.core import spec as S
from clusterfsdp.data import checks, rankdata
from clusterfsdp.data import prepare as dataprep
from clusterfsdp.data import samples as datamod
from clusterfsdp.data.sources import DataError
from clusterfsdp.data.tokens import DocumentEncoder
from clusterfsdp.worker import loss as lossmod
from clusterfsdp.worker.loss import IGNORE_INDEX

MULTI_TURN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "river stone"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": "lamp"},
    {"role": "assistant", "content": "second"},
]


@pytest.fixture(scope="module")
def chat_tok(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tok") / "chatml")


def chat_job(tmp: Path, tokenizer: Path, n: int = 300, *extra: str) -> str:
    path = write_jsonl(tmp / "chat.jsonl", conversations(n))
    return f"""
[job]
name = "chat"
seed = 1
run_root = "{tmp}"
[model]
preset = "llama-tiny"
from_config = {{ vocab_size = 400 }}
[data]
source = "files"
paths = ["{path}"]
format = "chat"
tokenizer = "{tokenizer}"
seq_len = 64
[train]
steps = 40
micro_batch_size = 8
lr = 1e-2
schedule = "constant"
warmup = 2
log_every = 5
[fsdp]
mixed_precision = "fp32"
""" + "\n".join(extra)


def test_only_assistant_tokens_are_trained_on(chat_tok):
    enc = DocumentEncoder(str(chat_tok))
    (out,) = enc.chats([MULTI_TURN], ["record 1"])
    assert out.mask is not None
    ids = out.ids.tolist()
    trained = [i for i, m in zip(ids, out.mask.tolist(), strict=True) if m]
    prompt = [i for i, m in zip(ids, out.mask.tolist(), strict=True) if not m]
    assert enc.tok.decode(trained) == "first answer<|im_end|>\nsecond<|im_end|>\n"
    assert enc.tok.decode(prompt) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nriver stone<|im_end|>\n"
        "<|im_start|>assistant\n<|im_start|>user\nlamp<|im_end|>\n<|im_start|>assistant\n"
    )
    assert enc.tok.decode(ids) == enc.tok.apply_chat_template(MULTI_TURN, tokenize=False)


def test_templates_that_cannot_be_split_exactly_are_refused(tmp_path, chat_tok):
    rewriting = make_tokenizer(
        tmp_path / "rewrites",
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
        "{% if m['role'] == 'assistant' and not loop.last %}(earlier){% else %}{{ m['content'] }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    with pytest.raises(DataError, match=r"^d.jsonl:3: the tokenizer's chat template renders the conversation up to"):
        DocumentEncoder(str(rewriting)).chats([MULTI_TURN], ["d.jsonl:3"])
    strict = make_tokenizer(
        tmp_path / "strict",
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system messages') }}"
        "{% endif %}{{ m['content'] }}{% endfor %}",
    )
    with pytest.raises(DataError, match=r"^d.jsonl:7: the chat template refused this conversation: no system messages"):
        DocumentEncoder(str(strict)).chats([MULTI_TURN], ["d.jsonl:7"])


def test_chat_data_without_a_template_or_an_answer_is_refused_before_queueing(tmp_path, chat_tok):
    plain = make_tokenizer(tmp_path / "plain", chat_template=None)
    job = S.loads(chat_job(tmp_path, plain, 5))
    assert checks.problems(job) == [
        f"data.tokenizer: {plain} has no chat template (tokenizer_config.json 'chat_template' or chat_template.jinja), "
        "which data.format = 'chat' needs"
    ]
    no_answer = write_jsonl(tmp_path / "q.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    job = S.loads(chat_job(tmp_path, chat_tok, 5), [f"data.paths=['{no_answer}']"])
    assert checks.problems(job) == [
        f"data.paths[0]: {no_answer}:1: 'messages' has no 'assistant' message: nothing to train on"
    ]


def test_prompt_tokens_contribute_exactly_zero_gradient(tmp_path, chat_tok):
    """A batch from the real pipeline (prepared chat data, documents packing): d loss / d hidden
    state and d loss / d logits are exactly 0.0 at every position whose target is a prompt token
    (or padding), for the fused loss and the logits path, and the weight gradients equal those
    of a loss computed from the assistant positions alone."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from clusterfsdp.core.presets import PRESETS

    spec = S.loads(chat_job(tmp_path, chat_tok, 40))
    dataprep.ensure(spec, workers=1)
    train = rankdata.open_for_training(spec, 0, print).train
    assert isinstance(train, datamod.PreparedSamples)
    batch = train.batch(0, 0, 1, 4)
    assert batch.position_ids is not None
    answer = batch.labels != IGNORE_INDEX
    assert 0 < int(answer.sum()) < answer.numel() // 4  # mostly prompt: a real test

    config = LlamaConfig(**{**PRESETS["llama-tiny"], "vocab_size": 400})
    config._attn_implementation = "sdpa"
    results = {}
    for fused in (True, False):
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).float()
        captured = {}

        def keep(_module, _inputs, output, captured=captured):
            output.retain_grad()
            captured["h"] = output

        model.model.norm.register_forward_hook(keep)
        if fused:
            assert lossmod.attach(model, compile=False)
            loss = lossmod.causal_lm_loss(
                model, batch.input_ids, batch.labels, position_ids=batch.position_ids, reduction="sum"
            )
        else:
            logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids).logits
            logits.retain_grad()
            captured["logits"] = logits
            loss = lossmod._logits_loss(logits, batch.labels, "sum")
        loss.backward()
        grad_h = captured["h"].grad
        assert torch.count_nonzero(grad_h[~answer]) == 0  # exactly zero, not small
        assert bool((grad_h[answer].abs().sum(-1) > 0).all())
        if not fused:
            assert torch.count_nonzero(captured["logits"].grad[~answer]) == 0
        results[fused] = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    # the same model, loss over the assistant positions only (no masking involved)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float()
    logits = model(input_ids=batch.input_ids, position_ids=batch.position_ids).logits
    torch.nn.functional.cross_entropy(logits[answer], batch.labels[answer], reduction="sum").backward()
    for name, p in model.named_parameters():
        assert p.grad is not None
        for fused in (True, False):
            torch.testing.assert_close(results[fused][name], p.grad, rtol=1e-4, atol=1e-6)


def test_chat_fine_tuning_reaches_near_zero_loss_and_eval_loss(tmp_path, chat_tok):
    run = make_run(chat_job(tmp_path, chat_tok, 300, "[eval]\nfraction = 0.1\nevery_steps = 20\nbatches = 2"), tmp_path)
    out = run_workers(run, 1)
    rows = run.metrics()
    assert rows[0]["loss"] > 1.0, rows[0]
    assert rows[-1]["step"] == 40 and rows[-1]["loss"] < 0.05, [r["loss"] for r in rows]
    evals = [r for r in rows if "eval_loss" in r]
    assert [r["step"] for r in evals] == [20, 40]
    assert evals[-1]["eval_loss"] < 0.05 and evals[-1]["eval_ppl"] == pytest.approx(math.exp(evals[-1]["eval_loss"]))
    assert "documents packing" in out[0][1] and "eval_loss" in out[0][1]


def test_conversations_that_cannot_be_read_or_rendered_are_skipped_and_named(tmp_path):
    """data.bad_records = 'skip' with chat data: a message whose role is not a string (the record
    check) and a role the template refuses (raise_exception) are left out, each named by line."""
    strict = make_tokenizer(
        tmp_path / "strict",
        "{% for m in messages %}{% if m['role'] not in ['system', 'user', 'assistant'] %}"
        "{{ raise_exception('unknown role ' + m['role']) }}{% endif %}<|im_start|>{{ m['role'] }}\n"
        "{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
    )
    records = conversations(40)
    records[6] = {"messages": [{"role": 5, "content": "hi"}, {"role": "assistant", "content": "yes"}]}
    records[22] = {"messages": [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "yes"}]}
    path = write_jsonl(tmp_path / "mixed.jsonl", records)
    spec = S.loads(chat_job(tmp_path, strict, 5), [f"data.paths=['{path}']", "data.bad_records=skip:2"])
    (ref,) = dataprep.ensure(spec, workers=1)
    manifest = ref.manifest()
    assert manifest is not None and manifest["documents"] == 38
    assert manifest["bad_records"]["skipped"] == 2 and manifest["bad_records"]["records"] == 40
    first = manifest["bad_records"]["first"]
    assert first[0].startswith(f"data.paths[0]: {path}:7: messages[0] is not an object")
    assert first[1] == f"data.paths[0]: {path}:23: the chat template refused this conversation: unknown role tool"
    with pytest.raises(DataError, match=f"^data.paths\\[0\\]: {path}:7: messages\\[0\\]"):
        dataprep.ensure(S.loads(chat_job(tmp_path, strict, 5), [f"data.paths=['{path}']"]), workers=1)


LONG_SECOND_TURN = [
    {"role": "user", "content": "river stone"},
    {"role": "assistant", "content": "first answer"},
    {"role": "user", "content": " ".join(["lamp quiet north garden"] * 12)},
    {"role": "assistant", "content": "zebra " * 20},
]
LONG_FIRST_PROMPT = [
    {"role": "user", "content": " ".join(["silver window paper horse"] * 15)},
    {"role": "assistant", "content": "yes"},
]


def _kept_documents(train: datamod.PreparedSamples, tokenizer: Path) -> list[str]:
    """The text of every document (or piece) the sample index holds, decoded."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer)
    n = int(train.offsets.read(train.count, 1)[0])
    flat = train.segments.read(0, 2 * n)
    return [tok.decode(train.tokens.read(int(flat[i]), int(flat[i + 1]))) for i in range(0, len(flat), 2)]


@pytest.mark.parametrize(
    ("policy", "counts"),
    [
        ("split", {"split": 2, "truncated": 0, "dropped": 0}),
        ("truncate", {"split": 0, "truncated": 1, "dropped": 1}),
        ("drop", {"split": 0, "truncated": 0, "dropped": 2}),
    ],
)
def test_overlong_conversations_keep_each_answer_with_its_prompt(tmp_path, chat_tok, policy, counts):
    """data.overlong on chat data (seq_len 96): 'truncate' keeps the whole first turn of a
    conversation whose second turn does not fit (and nothing of its second answer), and drops one
    whose first prompt alone does not fit; 'drop' drops both; 'split' cuts both into pieces."""
    records = [*conversations(30), {"messages": LONG_SECOND_TURN}, {"messages": LONG_FIRST_PROMPT}]
    path = write_jsonl(tmp_path / "long.jsonl", records)
    spec = S.loads(
        chat_job(tmp_path, chat_tok, 5),
        [f"data.paths=['{path}']", f"data.overlong={policy}", "data.seq_len=96", "train.micro_batch_size=2"],
    )
    dataprep.ensure(spec, workers=1)
    train = rankdata.open_for_training(spec, 0, print).train
    assert isinstance(train, datamod.PreparedSamples)
    assert train.meta["overlong"] == {"overlong": 2, **counts}
    kept = _kept_documents(train, chat_tok)
    from transformers import AutoTokenizer

    first_turn = AutoTokenizer.from_pretrained(chat_tok).apply_chat_template(LONG_SECOND_TURN[:2], tokenize=False)
    zebras = sum("zebra" in d for d in kept)
    if policy == "truncate":
        assert first_turn in kept and zebras == 0 and not any("silver window" in d for d in kept)
    elif policy == "drop":
        assert not any("river stone" in d or "silver window" in d for d in kept)
    else:
        assert zebras >= 1 and any("silver window" in d for d in kept)
    assert 0 < train.meta["trained"] < 1 - train.meta["padding"]  # prompts are not trained on
