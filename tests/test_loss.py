"""clusterfsdp/loss.py: the fused, chunked lm_head + cross-entropy equals logits + F.cross_entropy,
and the per-row label log-probs of the preference objectives equal logits + log_softmax.

Fast, one process, CPU, float32: loss and gradients must agree within 1e-5.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from clusterfsdp.core.presets import PRESETS
from clusterfsdp.worker import loss as lossmod


def _tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{k: v for k, v in PRESETS["llama-tiny"].items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    config.use_cache = False
    return LlamaForCausalLM(config).float()


def _batch(vocab: int, bs: int = 3, seq: int = 17, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (bs, seq + 1), generator=torch.Generator().manual_seed(seed))


def _grads(model) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("chunk_elements", [lossmod.CHUNK_ELEMENTS, 1000])  # one chunk; many uneven chunks
def test_linear_cross_entropy_matches_unfused(chunk_elements: int, reduction: lossmod.Reduction) -> None:
    torch.manual_seed(0)
    n, hidden_size, vocab = 51, 64, 260
    hidden = torch.randn(n, hidden_size, requires_grad=True)
    weight = (0.1 * torch.randn(vocab, hidden_size)).requires_grad_()
    labels = torch.randint(0, vocab, (n,))
    labels[::7] = lossmod.IGNORE_INDEX  # ignored tokens count neither in the sum nor in the mean

    ref = F.cross_entropy(hidden @ weight.t(), labels, ignore_index=lossmod.IGNORE_INDEX, reduction=reduction)
    ref_gh, ref_gw = torch.autograd.grad(2.5 * ref, (hidden, weight))
    got = lossmod.linear_cross_entropy(hidden, weight, labels, chunk_elements=chunk_elements, reduction=reduction)
    gh, gw = torch.autograd.grad(2.5 * got, (hidden, weight))  # a non-unit upstream gradient

    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(gh[::7]) == 0  # an ignored token's hidden state gets exactly no gradient


@pytest.mark.parametrize("chunk_elements", [lossmod.CHUNK_ELEMENTS, 1000])  # one chunk; chunks across rows
def test_linear_label_logps_match_log_softmax_per_row(chunk_elements: int) -> None:
    """Each row's summed label log-prob, and the gradients under a different upstream gradient
    per row (as a preference loss gives), equal log_softmax over the whole logits."""
    torch.manual_seed(0)
    rows, seq, hidden_size, vocab = 6, 9, 64, 260
    hidden = torch.randn(rows, seq, hidden_size, requires_grad=True)
    weight = (0.1 * torch.randn(vocab, hidden_size)).requires_grad_()
    labels = torch.randint(0, vocab, (rows, seq))
    labels[:, :3] = lossmod.IGNORE_INDEX  # a prompt
    labels[4] = lossmod.IGNORE_INDEX  # a row with nothing trained
    upstream = torch.tensor([1.0, -2.0, 0.5, 3.0, 1.0, -0.25])

    valid = labels != lossmod.IGNORE_INDEX
    logp = F.log_softmax(hidden @ weight.t(), dim=-1).gather(2, torch.where(valid, labels, 0).unsqueeze(2)).squeeze(2)
    ref = (logp * valid).sum(dim=1)
    ref_gh, ref_gw = torch.autograd.grad((upstream * ref).sum(), (hidden, weight))
    got = lossmod.linear_label_logps(hidden, weight, labels, chunk_elements=chunk_elements)
    gh, gw = torch.autograd.grad((upstream * got).sum(), (hidden, weight))

    assert got.shape == (rows,) and got.dtype == torch.float32 and float(got[4].detach()) == 0.0
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gh, ref_gh, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(gw, ref_gw, rtol=1e-5, atol=1e-5)
    assert torch.count_nonzero(gh[:, :3]) == 0 and torch.count_nonzero(gh[4]) == 0


def test_a_fully_ignored_batch_sums_to_zero_not_nan() -> None:
    """A micro-batch of prompt tokens and padding only (possible with chat data) adds nothing."""
    hidden = torch.randn(5, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    labels = torch.full((5,), lossmod.IGNORE_INDEX)
    got = lossmod.linear_cross_entropy(hidden, weight, labels, reduction="sum")
    gh, gw = torch.autograd.grad(got, (hidden, weight))
    assert float(got.detach()) == 0.0 and torch.count_nonzero(gh) == 0 and torch.count_nonzero(gw) == 0


def test_causal_lm_loss_fused_equals_logits_path() -> None:
    """The whole llama-tiny model: attached fused loss vs model(...).logits + cross-entropy."""
    plain, fused = _tiny_llama(), _tiny_llama()
    assert lossmod.attach(fused, compile=False)
    assert not hasattr(plain, "clusterfsdp_loss")
    batch = _batch(plain.config.vocab_size)
    inputs, labels = batch[:, :-1], batch[:, 1:]

    ref = lossmod.causal_lm_loss(plain, inputs, labels)
    got = lossmod.causal_lm_loss(fused, inputs, labels)
    ref.backward()
    got.backward()

    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    ref_grads, got_grads = _grads(plain), _grads(fused)
    assert ref_grads.keys() == got_grads.keys() and "model.embed_tokens.weight" in got_grads  # tied lm_head
    for name, g in ref_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_preference_logps_fused_equal_the_logits_path() -> None:
    """The whole llama-tiny model: `preference.sequence_logps` through the attached per-row method
    (one chunk of logits at a time) equals model(...).logits + log_softmax, values and gradients."""
    from clusterfsdp.data.samples import Batch
    from clusterfsdp.worker import preference

    plain, fused = _tiny_llama(), _tiny_llama()
    assert lossmod.attach(fused, compile=False) and not hasattr(plain, "clusterfsdp_logps")
    ids = _batch(plain.config.vocab_size, bs=4)
    labels = ids[:, 1:].clone()
    labels[:, :5] = lossmod.IGNORE_INDEX
    batch = Batch(input_ids=ids[:, :-1], labels=labels)
    ref, ref_counts = preference.sequence_logps(plain, batch)
    got, counts = preference.sequence_logps(fused, batch)
    upstream = torch.tensor([1.0, -1.0, 0.5, 2.0])
    (upstream * ref).sum().backward()
    (upstream * got).sum().backward()

    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(counts, ref_counts)
    ref_grads, got_grads = _grads(plain), _grads(fused)
    assert ref_grads.keys() == got_grads.keys() and "model.embed_tokens.weight" in got_grads
    for name, g in ref_grads.items():
        torch.testing.assert_close(got_grads[name], g, rtol=1e-5, atol=1e-5, msg=lambda m, name=name: f"{name}: {m}")


def test_fused_loss_without_grad() -> None:
    model = _tiny_llama()
    lossmod.attach(model, compile=False)
    batch = _batch(model.config.vocab_size)
    with torch.no_grad():
        got = lossmod.causal_lm_loss(model, batch[:, :-1], batch[:, 1:])
        ref = F.cross_entropy(model(input_ids=batch[:, :-1]).logits.flatten(0, 1), batch[:, 1:].flatten())
    assert not got.requires_grad
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


def test_unsupported_head_keeps_forward() -> None:
    model = _tiny_llama()
    model.lm_head = torch.nn.Linear(64, 260, bias=True)
    assert not lossmod.supports_fused(model) and not lossmod.attach(model, compile=False)


def test_moe_loss_adds_the_router_aux_loss_when_the_config_asks_for_it() -> None:
    """Mixtral with output_router_logits: our loss equals transformers' own (cross-entropy plus
    router_aux_loss_coef x load-balancing loss); without it, plain cross-entropy."""
    from transformers import AutoConfig, AutoModelForCausalLM

    keys = dict(PRESETS["mixtral-tiny"])
    config = AutoConfig.for_model(keys.pop("model_type"), **keys)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).float()
    batch = _batch(config.vocab_size)
    x, y = batch[:, :-1], batch[:, 1:].contiguous()
    ours = lossmod.causal_lm_loss(model, x, y)
    theirs = model(input_ids=x, labels=y, shift_labels=y).loss  # labels already shifted
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    plain = F.cross_entropy(model(input_ids=x).logits.flatten(0, 1), y.flatten())
    assert float(ours - plain) > 1e-4  # the auxiliary loss is in there
    model.config.output_router_logits = False
    torch.testing.assert_close(lossmod.causal_lm_loss(model, x, y), plain)
