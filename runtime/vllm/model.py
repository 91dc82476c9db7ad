"""The model folder vLLM serves in the tests and the CPU figures: a tiny Llama whose
``config.json`` alone is written (vLLM loads it with ``load_format="dummy"``: random weights, no
download, no tokenizer; prompts go in as token ids). A folder with real weights works the same
way with ``load_format="auto"``."""

from __future__ import annotations

import json
from pathlib import Path

TINY_LLAMA: dict[str, object] = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
    "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 32000, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2,
    "tie_word_embeddings": False, "rope_theta": 10000.0, "hidden_act": "silu",
}
"""the tiny model: hidden 256, 2 layers, 4 heads, 2 KV heads, vocabulary 32,000 (the shape of
the torch executor's ``tiny``, as a Hugging Face Llama config), 8,192 positions (the Azure
traces' longest requests fit)"""


def write_tiny_model(folder: str | Path, **overrides: object) -> Path:
    """Write the tiny model's ``config.json`` (with ``overrides``) into ``folder``; returns it."""
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({**TINY_LLAMA, **overrides}, indent=2) + "\n")
    return path


def has_weights(folder: str | Path) -> bool:
    """Whether a model folder holds weights (safetensors or PyTorch bins), else it is served with
    dummy weights."""
    p = Path(folder)
    return any(p.glob("*.safetensors")) or any(p.glob("*.bin"))


def read_config(folder: str | Path) -> dict:
    """The folder's ``config.json``; a clear error when it has none."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"model folder {folder}: no config.json (write the tiny one with "
                                "runtime.vllm.model.write_tiny_model, or give a Hugging Face "
                                "model folder)")
    config: dict = json.loads(path.read_text())
    return config


def kv_bytes_per_token(config: dict, dtype_bytes: int = 2) -> int:
    """KV-cache bytes one token takes in a Llama-like model: keys and values of every layer."""
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim", int(config["hidden_size"]) // heads))
    return 2 * int(config["num_hidden_layers"]) * kv_heads * head_dim * dtype_bytes


def weight_bytes(config: dict, dtype_bytes: int = 2) -> int:
    """Bytes of a Llama-like model's weights (embeddings, attention, MLP, norms, head)."""
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv_heads = int(config.get("num_key_value_heads", heads))
    head_dim = int(config.get("head_dim", h // heads))
    inter = int(config["intermediate_size"])
    vocab = int(config["vocab_size"])
    layer = h * head_dim * (heads + 2 * kv_heads) + heads * head_dim * h + 3 * h * inter + 2 * h
    head = 0 if config.get("tie_word_embeddings") else vocab * h
    return dtype_bytes * (vocab * h + int(config["num_hidden_layers"]) * layer + h + head)
