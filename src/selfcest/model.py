"""The tiny Qwen3-architecture model of the default profile, and offline loading of any checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase, Qwen3Config


@dataclass
class TinyModelConfig:
    """Shape of the tiny Qwen3 model built by the default profile (fields mirror `Qwen3Config`)."""

    hidden_size: int = 128
    """Width of the residual stream."""
    intermediate_size: int = 384
    """Width of the SwiGLU MLP."""
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    """Grouped-query attention, as in Qwen3."""
    head_dim: int = 32
    max_position_embeddings: int = 1024
    """Longest sequence the rotary embedding is set up for (not the length it was trained on)."""
    rope_theta: float = 10000.0
    position_encoding: str = "rope"
    """`rope` (Qwen3's rotary embedding) or `none` (NoPE: causal attention alone tells positions
    apart, which generalises past the training lengths better than RoPE in small decoder-only
    models on arithmetic and copying; Kazemnejad et al. 2023)."""
    tie_word_embeddings: bool = True
    """Tied input/output embeddings keep the parameter count small."""


def build_tiny_model(
    config: TinyModelConfig, tokenizer: PreTrainedTokenizerBase, *, seed: int
) -> PreTrainedModel:
    """A randomly initialised Qwen3ForCausalLM sized by `config`, matched to `tokenizer`'s vocabulary."""
    qwen_config = Qwen3Config(
        rope_parameters=_rope_parameters(config),
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    # Seed a private generator so that building a model never disturbs the caller's RNG state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(qwen_config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.bos_token_id = None
    return model


# Qwen3 has no switch to turn the rotary embedding off. Linear position interpolation divides every
# position by `factor`; at 1e9 the largest rotation angle (position 1023, frequency 1) is ~1e-6 rad:
# cos rounds to 1 in float32 and |sin| stays below ~1e-6, so queries and keys pass through all but
# unrotated (NoPE up to ~1e-6; shifting every position by 900 moved the logits by ~5e-7). Kept in the
# saved config, so every loader (transformers, TRL, vLLM) builds the same model without extra code.
_NOPE_INTERPOLATION_FACTOR = 1e9


def _rope_parameters(config: TinyModelConfig) -> dict[str, object]:
    if config.position_encoding == "rope":
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.position_encoding == "none":
        return {"rope_type": "linear", "factor": _NOPE_INTERPOLATION_FACTOR, "rope_theta": config.rope_theta}
    raise ValueError(f"model.position_encoding must be 'rope' or 'none', got {config.position_encoding!r}")


def load_model(
    path: str | Path, *, dtype: torch.dtype | str = "auto", device: str = "cpu"
) -> PreTrainedModel:
    """Load any local causal-LM checkpoint (the tiny model or, say, Qwen3-4B-Instruct) offline."""
    model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
    model.to(device)
    model.eval()
    return model


def count_parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
