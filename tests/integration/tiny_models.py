"""Tiny random-weight checkpoints of other architectures and tokenizers, written by the tests.

Each is a Hugging Face folder (``config.json``, float32 ``model.safetensors``, tokenizer files) that
vLLM and the exact codec load like any downloaded model: 2 layers, hidden size 128 (head size 32,
the smallest vLLM's CPU attention takes), so a service starts in seconds. Weights are random
(seeded), so outputs are meaningless but deterministic; what the matrix checks is that nothing in
the service depends on pycoder's architecture, token ids or special-token names.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PYCODER = Path(__file__).resolve().parents[2] / "models" / "pycoder-23m"
CHATML = ("{% for message in messages %}{{ '<|begin|>' + message['role'] + '\n' + message['content'] + '<|end|>\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|begin|>assistant\n' }}{% endif %}")
TRAINING_TEXT = (PYCODER / "MODEL_CARD.md", Path(__file__).resolve().parents[2] / "README.md")


@dataclass(frozen=True)
class TinyModel:
    """One checkpoint of the matrix and what the service should do with it."""

    name: str
    config: dict[str, Any]
    tokenizer: str  # "pycoder" or "renamed-specials"
    chat_template: bool = True
    codec: bool = True  # False: the exact codec must refuse it (503 naming ``codec_reason``)
    codec_reason: str = ""
    serve_args: tuple[str, ...] = field(default=())
    env: dict[str, str] = field(default_factory=dict)


# ATen and oneDNN limited to AVX2, which every x86-64 host of this kind has (never ask for AVX-512):
# on an AVX-512 machine half-precision engines then run the kernels an AVX2-only one runs.
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def _llama(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 128, "intermediate_size": 256,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4, "head_dim": 32,
        "hidden_act": "silu", "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False,
        "attention_bias": False, "mlp_bias": False, "initializer_range": 0.2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}, "dtype": "float32",
    }
    base.update(overrides)
    return base


MATRIX: tuple[TinyModel, ...] = (
    TinyModel("tiny-qwen2-gqa", {
        **_llama(), "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "num_key_value_heads": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}, "use_sliding_window": False,
        "max_window_layers": 2}, "pycoder"),
    TinyModel("tiny-llama-linear-rope", _llama(
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}, tie_word_embeddings=True),
        "renamed-specials"),
    TinyModel("tiny-llama3-rope-no-template", _llama(
        num_key_value_heads=2, rope_parameters={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 128, "rope_theta": 500000.0}),
        "pycoder", chat_template=False, serve_args=("--no-enable-predictions", "--dtype", "bfloat16"), env=AVX2_ONLY),
    TinyModel("tiny-gpt2", {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 128, "n_layer": 2, "n_head": 4,
        "n_positions": 512, "n_inner": 256, "activation_function": "gelu_new", "initializer_range": 0.2,
        "tie_word_embeddings": True, "dtype": "float32"},
        "pycoder", codec=False, codec_reason="GPT2LMHeadModel",
        serve_args=("--no-enable-predictions", "--dtype", "float16"), env=AVX2_ONLY),
)


def _pycoder_tokenizer(folder: Path, chat_template: bool) -> dict[str, int]:
    for name in ("tokenizer.json", "special_tokens_map.json"):
        shutil.copy(PYCODER / name, folder / name)
    config = json.loads((PYCODER / "tokenizer_config.json").read_text())
    if not chat_template:
        config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    return {"vocab_size": 8192, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}


def _renamed_specials_tokenizer(folder: Path, chat_template: bool) -> dict[str, int]:
    """A byte-level BPE of 1,000 tokens trained here, whose special tokens come last and are named
    otherwise (``<|begin|>``, ``<|end|>``, ``<|pad|>``; no ``<s>``/``</s>``). The model's output
    vocabulary is padded to a multiple of 64, past the tokenizer's 1,003 ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tokenizer.train_from_iterator((path.read_text() for path in TRAINING_TEXT), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<|begin|>", eos_token="<|end|>",
                                   pad_token="<|pad|>", clean_up_tokenization_spaces=False)
    if chat_template:
        fast.chat_template = CHATML
    fast.save_pretrained(folder)
    ids = {f"{role}_token_id": fast.convert_tokens_to_ids(f"<|{name}|>")
           for role, name in (("bos", "begin"), ("eos", "end"), ("pad", "pad"))}
    return {"vocab_size": -(-len(fast) // 64) * 64, **ids}  # padded past the tokenizer, as many models are


def model_vocab_of_tokenizer(folder: Path) -> int:
    """How many ids the checkpoint's tokenizer has (the model's output vocabulary may be larger)."""
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(folder))


def build(model: TinyModel, folder: Path, seed: int = 0) -> Path:
    """Write ``model``'s checkpoint into ``folder`` (created) and return it."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    make_tokenizer = _pycoder_tokenizer if model.tokenizer == "pycoder" else _renamed_specials_tokenizer
    ids = make_tokenizer(folder, model.chat_template)
    raw = {**model.config, **ids}
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(seed)
    network = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():  # untrained padding rows stay at zero, as in real checkpoints: never the argmax
        network.get_output_embeddings().weight[model_vocab_of_tokenizer(folder):] = 0.0
    network.save_pretrained(folder, safe_serialization=True)
    written = json.loads((folder / "config.json").read_text())
    written.update({key: model.config[key] for key in ("rope_parameters",) if key in model.config})
    (folder / "config.json").write_text(json.dumps(written, indent=1))
    (folder / "generation_config.json").write_text(json.dumps(
        {key: ids[key] for key in ("bos_token_id", "eos_token_id", "pad_token_id")}))
    return folder
