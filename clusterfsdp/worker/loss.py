"""The causal-LM loss without the full logits tensor.

With a 128k vocabulary the logits of one micro-batch are the largest tensors of the step
(8 × 2048 tokens × 128256 × 4 bytes = 8.4 GB in fp32, plus their gradient), and an
unfused cross-entropy over them costs several passes through that memory.
`linear_cross_entropy` computes lm_head and the cross-entropy together, a chunk of tokens
at a time: for each chunk it forms the logits (matmul in the compute dtype, fp32
accumulation), the loss and d loss / d logits with fp32 math (log-sum-exp, softmax), and
immediately turns that gradient into the gradients of the hidden states and of the lm_head
weight (accumulated in fp32 across chunks). Only one chunk of logits ever exists, and
backward is two scalings of tensors computed in forward. The matmul FLOPs are the same as
the unfused forward + backward: nothing is recomputed.

`attach(model, compile=...)` gives a supported HF causal LM (logits = lm_head(hidden),
no bias, no logit scaling or soft-capping) a `clusterfsdp_loss(input_ids, labels)`
method, and `clusterfsdp_logps(input_ids, labels)`: each row's summed label log-probs, which
the preference objectives need (`linear_label_logps`, recomputing each chunk's logits in
backward). Under FSDP2 both are registered as forward methods, so the root unit's parameters
(the tied embedding / lm_head) are gathered around them exactly as around `forward`.
`causal_lm_loss` uses that method when present and otherwise falls back to
`model(input_ids).logits` + cross-entropy (FSDP1, other architectures), plus the router's
auxiliary loss for a mixture of experts that asks for it.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any, Literal  # models: transformers PreTrainedModels, possibly FSDP-wrapped

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import register_fsdp_forward_method

from ..data.tokens import IGNORE_INDEX

Reduction = Literal["mean", "sum"]
# Largest chunk of logits formed at once, in elements (2**29: 1 GiB of bf16 logits, and as much
# again for their gradient; 4096 tokens of a 128k vocabulary).
CHUNK_ELEMENTS = 2**29
# The same for the preference objectives' per-row log-probs (one fp32 buffer of a chunk in
# backward: the logits again, turned into their gradient in place; 256 MiB).
LOGPS_CHUNK_ELEMENTS = 2**26
# Architectures whose logits are exactly lm_head(final hidden state): no bias, scaling or capping.
FUSED_ARCHITECTURES = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


def _ce_chunk(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int, grad_dtype: torch.dtype):
    """Summed cross-entropy of one chunk and d(summed loss)/d(logits), with fp32 math."""
    x = logits.float()
    valid = labels != ignore_index
    safe = torch.where(valid, labels, 0)
    lse = torch.logsumexp(x, dim=-1)
    target = x.gather(1, safe.unsqueeze(1)).squeeze(1)
    loss = torch.where(valid, lse - target, 0.0).sum()
    probs = torch.exp(x - lse.unsqueeze(1))
    hit = torch.arange(x.shape[1], device=x.device).unsqueeze(0) == safe.unsqueeze(1)
    grad = torch.where(valid.unsqueeze(1), probs - hit.to(probs.dtype), 0.0)
    return loss, grad.to(grad_dtype)


_compiled_ce: Callable | None = None


def _ce(compile: bool) -> Callable:
    global _compiled_ce
    if not compile:
        return _ce_chunk
    if _compiled_ce is None:
        _compiled_ce = torch.compile(_ce_chunk, dynamic=False)
    return _compiled_ce


_OUT_DTYPE_MM: bool | None = None  # whether addmm(..., out_dtype=float32) works here (CUDA, torch >= 2.8)


def _accumulate(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """acc (fp32) + a @ b, with a and b in the compute dtype and the sum kept in fp32."""
    global _OUT_DTYPE_MM
    if a.dtype == torch.float32:
        return acc.addmm_(a, b)
    if _OUT_DTYPE_MM is not False and a.is_cuda:
        try:
            out = torch.addmm(acc, a, b, out_dtype=torch.float32)
            _OUT_DTYPE_MM = True
            return out
        except (RuntimeError, TypeError):
            _OUT_DTYPE_MM = False
    return acc.add_(torch.mm(a, b))


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, labels, ignore_index: int, chunk: int, ce: Callable, grad_enabled: bool, mean: bool
    ):
        # (needs_input_grad is also true under no_grad: the caller passes the grad mode)
        need_h, need_w = grad_enabled and ctx.needs_input_grad[0], grad_enabled and ctx.needs_input_grad[1]
        n = hidden.shape[0]
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        for start in range(0, n, chunk):
            h, y = hidden[start : start + chunk], labels[start : start + chunk]
            logits = torch.mm(h, weight.t())
            loss, g = ce(logits, y, ignore_index, hidden.dtype)
            del logits
            total += loss
            if grad_h is not None:
                torch.mm(g, weight, out=grad_h[start : start + chunk])
            if grad_w is not None:
                grad_w = _accumulate(grad_w, g.t(), h)
        count = (labels != ignore_index).sum() if mean else torch.ones((), device=hidden.device)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_h, grad_w, count)
        return total / count

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w, count = ctx.saved_tensors
        scale = grad_out.float() / count
        gh = grad_h * scale if grad_h is not None and ctx.needs_input_grad[0] else None
        gw = (grad_w * scale).to(ctx.weight_dtype) if grad_w is not None and ctx.needs_input_grad[1] else None
        return gh, gw, None, None, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    compile: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    """mean (or sum) over non-ignored tokens of cross_entropy(hidden @ weight.T, labels), chunked.
    Ignored tokens contribute exactly zero to the loss and to every gradient.

    hidden: (..., H) in the compute dtype; weight: (V, H); labels: (...) int.
    """
    h = hidden.reshape(-1, hidden.shape[-1])
    chunk = _chunk_tokens(h.shape[0], weight.shape[0], chunk_elements)
    return _LinearCrossEntropy.apply(
        h, weight, labels.reshape(-1), ignore_index, chunk, _ce(compile), torch.is_grad_enabled(), reduction == "mean"
    )


def _chunk_tokens(n: int, vocab: int, chunk_elements: int) -> int:
    """Tokens per chunk: equal chunks (one compiled shape) of at most `chunk_elements` logits."""
    pieces = max(1, -(-n * vocab // chunk_elements))
    return -(-n // pieces)


class _LinearLabelLogps(torch.autograd.Function):
    """Per row: the summed log-prob of its labels under softmax(hidden @ weight.T).

    Preference objectives need one number per row, and each row's gradient scale is known only
    in backward, so `_LinearCrossEntropy`'s trick of finishing the gradients in forward does not
    apply. Forward keeps each chunk's per-token log-probs, backward forms each chunk's logits
    again. One chunk of logits exists at a time in both passes, at the cost of a second lm_head
    matmul in backward."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, rows: int, ignore_index: int, chunk: int):
        n = hidden.shape[0]
        token = torch.zeros(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk):
            x = torch.mm(hidden[start : start + chunk], weight.t()).float()
            y = labels[start : start + chunk]
            valid = y != ignore_index
            target = x.gather(1, torch.where(valid, y, 0).unsqueeze(1)).squeeze(1)
            token[start : start + chunk] = torch.where(valid, target - torch.logsumexp(x, dim=-1), 0.0)
            del x
        ctx.save_for_backward(hidden, weight, labels)
        ctx.rows, ctx.ignore_index, ctx.chunk = rows, ignore_index, chunk
        return token.view(rows, -1).sum(dim=1)

    @staticmethod
    def backward(ctx, grad_rows):
        hidden, weight, labels = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        per_token = grad_rows.float().repeat_interleave(hidden.shape[0] // ctx.rows)
        grad_h = torch.empty_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            h, y = hidden[start : start + ctx.chunk], labels[start : start + ctx.chunk]
            valid = y != ctx.ignore_index
            coef = torch.where(valid, per_token[start : start + ctx.chunk], 0.0).unsqueeze(1)
            # d logp / d logits = onehot - softmax, times the row's upstream gradient: formed in
            # place in one fp32 buffer (softmax, scaled, then the label's entry added)
            g = torch.mm(h, weight.t()).float()
            g.sub_(torch.logsumexp(g, dim=-1, keepdim=True)).exp_().mul_(-coef)
            g.scatter_add_(1, torch.where(valid, y, 0).unsqueeze(1), coef)
            g = g.to(hidden.dtype)
            if grad_h is not None:
                torch.mm(g, weight, out=grad_h[start : start + ctx.chunk])
            if grad_w is not None:
                grad_w = _accumulate(grad_w, g.t(), h)
            del g
        return grad_h, (grad_w.to(weight.dtype) if grad_w is not None else None), None, None, None, None


def linear_label_logps(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = IGNORE_INDEX,
    chunk_elements: int = LOGPS_CHUNK_ELEMENTS,
) -> torch.Tensor:
    """Per row of `labels` (rows, T): the sum over its non-ignored tokens of log softmax(hidden @
    weight.T)[label], in fp32, with the logits formed a chunk of tokens at a time.

    hidden: (rows, T, H) in the compute dtype; weight: (V, H); labels: (rows, T) int."""
    h = hidden.reshape(-1, hidden.shape[-1])
    chunk = _chunk_tokens(h.shape[0], weight.shape[0], chunk_elements)
    return _LinearLabelLogps.apply(h, weight, labels.reshape(-1), labels.shape[0], ignore_index, chunk)


def _fused_logps(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Bound to the HF model by `attach`: decoder stack, then each row's label log-probs, chunked."""
    hidden = self.base_model(input_ids=input_ids).last_hidden_state
    return linear_label_logps(hidden, self.get_output_embeddings().weight, labels)


def _fused_loss(
    self, input_ids: torch.Tensor, labels: torch.Tensor, position_ids: torch.Tensor | None, reduction: Reduction
) -> torch.Tensor:
    """Bound to the HF model by `attach`: decoder stack, then lm_head fused with the loss."""
    hidden = self.base_model(input_ids=input_ids, position_ids=position_ids).last_hidden_state
    return linear_cross_entropy(
        hidden,
        self.get_output_embeddings().weight,
        labels,
        compile=self._clusterfsdp_compile_loss,
        reduction=reduction,
    )


def _architecture(model: Any) -> str:
    """The model's class name; FSDP2's `fully_shard` swaps the class for a subclass of it named
    `FSDP<name>` (bases: FSDPModule, the class), which is the class looked at here."""
    cls = type(model)
    if cls.__name__.startswith("FSDP") and len(cls.__bases__) == 2 and cls.__bases__[0].__name__ == "FSDPModule":
        cls = cls.__bases__[1]
    return cls.__name__


def supports_fused(model: Any) -> bool:
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return (
        _architecture(model) in FUSED_ARCHITECTURES
        and isinstance(head, torch.nn.Linear)
        and head.bias is None
        and getattr(model, "base_model", model) is not model
    )


def attach(model: Any, *, compile: bool) -> bool:
    """Give `model` the fused `clusterfsdp_loss` method (an FSDP2 forward method when sharded)."""
    if not supports_fused(model):
        return False
    # plain attributes (not parameters or submodules), set past nn.Module's typed __setattr__
    object.__setattr__(model, "_clusterfsdp_compile_loss", compile)
    object.__setattr__(model, "clusterfsdp_loss", types.MethodType(_fused_loss, model))
    object.__setattr__(model, "clusterfsdp_logps", types.MethodType(_fused_logps, model))
    register_fsdp_forward_method(model, "clusterfsdp_loss")
    register_fsdp_forward_method(model, "clusterfsdp_logps")
    return True


def _logits_loss(logits: torch.Tensor, labels: torch.Tensor, reduction: Reduction) -> torch.Tensor:
    return F.cross_entropy(
        logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX, reduction=reduction
    )


_compiled_logits_loss: Callable | None = None


def causal_lm_loss(
    model: Any,
    input_ids: torch.Tensor,
    labels: torch.Tensor,
    *,
    position_ids: torch.Tensor | None = None,
    compile: bool = False,
    reduction: Reduction = "mean",
) -> torch.Tensor:
    """Next-token cross-entropy, mean or sum over the labels that are not IGNORE_INDEX; `labels`
    are the already shifted targets of `input_ids`. `position_ids` that restart inside a row
    mark packed documents (the attention kernels keep them apart, see data.py).

    A mixture of experts whose config asks for router logits (`output_router_logits`) also gets
    its load-balancing loss, weighted by `router_aux_loss_coef`, as transformers adds it (per
    token: scaled by the label count under reduction 'sum', so it weighs as under 'mean')."""
    global _compiled_logits_loss
    fused: Callable[..., torch.Tensor] | None = getattr(model, "clusterfsdp_loss", None)
    if fused is not None:
        return fused(input_ids, labels, position_ids, reduction)
    out = model(input_ids=input_ids, position_ids=position_ids)
    if compile:
        if _compiled_logits_loss is None:
            _compiled_logits_loss = torch.compile(_logits_loss)
        loss = _compiled_logits_loss(out.logits, labels, reduction)
    else:
        loss = _logits_loss(out.logits, labels, reduction)
    aux = getattr(out, "aux_loss", None)
    if aux is not None:
        weight = model.config.router_aux_loss_coef * aux.to(loss.device)
        loss = loss + (weight * (labels != IGNORE_INDEX).sum() if reduction == "sum" else weight)
    return loss
