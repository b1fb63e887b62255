"""Built-in random-init model architectures (HF LlamaConfig keyword arguments).

Plain data, no torch: `validate` checks preset names and estimates parameter counts
from this table without importing transformers.
"""

from __future__ import annotations

from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    # A few hundred thousand parameters: trains on 2 CPU cores in seconds.
    "llama-tiny": dict(
        vocab_size=260,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    ),
    # ~20M parameters with a 32k vocab: a realistic shape for smoke tests on one GPU.
    "llama-small": dict(
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
}


def llama_param_count(cfg: dict[str, Any]) -> int:
    """Parameters of a Llama config (tied embeddings counted once)."""
    h, i, L, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim", h // heads)
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    layer = attn + 3 * h * i + 2 * h
    emb = v * h * (1 if cfg.get("tie_word_embeddings", False) else 2)
    return L * layer + emb + h
