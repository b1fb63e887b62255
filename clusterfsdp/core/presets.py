"""Built-in random-init model configs: each preset is what a HF `config.json` would hold
(`model_type` plus that family's config keys), built by `AutoConfig.for_model` on the workers.

Plain data, no torch: `validate` checks preset names and estimates parameter counts from this
table without importing transformers (`modelsource.param_estimate`). Any other family can be
initialized from `[model] from_config = { model_type = "...", ... }` with `preset = ""`, or from a
folder holding a `config.json` (`[model] config`).
"""

from __future__ import annotations

from typing import Any

# The byte tokenizer's vocabulary (256 bytes + BOS, EOS, PAD + 1 spare): the tiny presets fit it exactly.
_TINY: dict[str, Any] = dict(vocab_size=260, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)

PRESETS: dict[str, dict[str, Any]] = {
    # A few hundred thousand parameters: trains on 2 CPU cores in seconds.
    "llama-tiny": dict(
        model_type="llama",
        **_TINY,
        intermediate_size=176,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # ~20M parameters with a 32k vocab: a realistic shape for smoke tests on one GPU.
    "llama-small": dict(
        model_type="llama",
        vocab_size=32000,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
    ),
    # Llama-3.2-1B's shape (random init): the benchmark configuration.
    "llama-1b": dict(
        model_type="llama",
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
    ),
    # Other families at the tiny size (tests: random init, resume and resharding beyond Llama).
    "qwen2-tiny": dict(
        model_type="qwen2",
        **_TINY,
        intermediate_size=176,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    "gpt-neox-tiny": dict(
        model_type="gpt_neox",
        **_TINY,
        intermediate_size=256,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    ),
    # Mixture of experts: 4 experts, 2 active per token, router auxiliary loss on.
    "mixtral-tiny": dict(
        model_type="mixtral",
        **_TINY,
        intermediate_size=96,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        output_router_logits=True,
        max_position_embeddings=512,
        tie_word_embeddings=False,
    ),
}


def preset_config(name: str) -> dict[str, Any]:
    """A copy of the preset's config keys, `model_type` included."""
    return dict(PRESETS[name])
