"""Every vLLM surface Cascade relies on, checked by import and inspection (no engine needed).

``problems()`` lists what differs from what Cascade was written against; ``require_compatible()``
raises ``IncompatibleVllmError`` listing all of it. The gateway calls the latter before starting
engines. Each check is one ``CHECKS`` entry:

- ``params``: a method's parameter names, exactly (a private method Cascade wraps or relies on);
- ``fields``: names the class declares as fields/constructor arguments (msgspec ``Struct`` fields,
  dataclass fields, or ``__init__`` parameters for a plain class);
- ``attrs``: names the class has (methods, properties, enum members);
- ``assigns``: instance attributes its ``__init__`` sets (``self.<name>``), which the class itself lacks.

``CLASSES`` says where each checked class lives. Tests pass stand-ins through ``classes``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NamedTuple

from cascade.vllm_compat.version import IncompatibleVllmError, check_vllm_version


class Check(NamedTuple):
    target: str  # a key of CLASSES
    kind: Literal["params", "fields", "attrs", "assigns"]
    names: tuple[str, ...]
    member: str = ""  # the method, for "params"


CLASSES: dict[str, str] = {
    "GPUModelRunner": "vllm.v1.worker.gpu_model_runner:GPUModelRunner",
    "SamplingParams": "vllm.sampling_params:SamplingParams",
    "RequestOutputKind": "vllm.sampling_params:RequestOutputKind",
    "StructuredOutputsParams": "vllm.sampling_params:StructuredOutputsParams",
    "RepetitionDetectionParams": "vllm.sampling_params:RepetitionDetectionParams",
    "AsyncEngineArgs": "vllm.engine.arg_utils:AsyncEngineArgs",
    "AsyncLLM": "vllm.v1.engine.async_llm:AsyncLLM",
    "RequestOutput": "vllm.outputs:RequestOutput",
    "CompletionOutput": "vllm.outputs:CompletionOutput",
    "RequestSpecDecodeMetrics": "vllm.v1.metrics.stats:RequestSpecDecodeMetrics",
    "FlatLogprobs": "vllm.logprobs:FlatLogprobs",
    "Logprob": "vllm.logprobs:Logprob",
    "TokensPrompt": "vllm.inputs.llm:TokensPrompt",
    "custom_class_proposer": "vllm.v1.spec_decode.custom_class_proposer",
    "rejection_sampler": "vllm.v1.sample.rejection_sampler",
}

CHECKS: tuple[Check, ...] = (
    # export_hook wraps it and relies on its compute_logits-per-request loop
    Check("GPUModelRunner", "params", ("self", "hidden_states", "num_scheduled_tokens"),
          "_get_prompt_logprobs_dict"),
    # bind_batch_hook wraps it (the custom_class proposer's only caller)
    Check("GPUModelRunner", "params", ("self", "scheduler_output", "sampled_token_ids", "sampling_metadata",
                                       "hidden_states", "sample_hidden_states", "aux_hidden_states",
                                       "spec_decode_metadata", "common_attn_metadata", "slot_mappings"),
          "propose_draft_token_ids"),
    # and this one (vLLM's zero drafts for a batch near max_model_len), with the same hook
    Check("GPUModelRunner", "params", ("self", "common_attn_metadata"), "_input_fits_in_drafter"),
    Check("custom_class_proposer", "params", ("vllm_config",), "create_custom_proposer"),
    # draft_sampling_fix replaces it (apply_sampling_constraints looks it up in the module)
    Check("rejection_sampler", "params", ("x", "cu_num_tokens", "num_tokens", "replace_from", "replace_to"),
          "expand_batch_to_tokens"),
    Check("rejection_sampler", "attrs", ("apply_sampling_constraints",)),
    # and wraps it (apply_sampling_constraints looks it up in the module too)
    Check("rejection_sampler", "params", ("logits", "k", "p"), "apply_top_k_top_p"),
    Check("SamplingParams", "fields", ("extra_args", "prompt_logprobs", "flat_logprobs", "skip_reading_prefix_cache",
                                       "detokenize", "output_kind", "structured_outputs", "logprobs", "top_k",
                                       "top_p", "min_p", "temperature", "logit_bias", "allowed_token_ids",
                                       "max_tokens", "stop_token_ids", "skip_special_tokens",
                                       "spaces_between_special_tokens", "logprob_token_ids", "stream_interval",
                                       "repetition_detection")),
    Check("SamplingParams", "attrs", ("bad_words_token_ids",)),
    Check("RequestOutputKind", "attrs", ("DELTA", "FINAL_ONLY")),
    Check("StructuredOutputsParams", "fields", ("grammar", "regex", "choice")),  # api/structured.py
    Check("RepetitionDetectionParams", "fields", ("max_pattern_size", "min_pattern_size", "min_count")),
    Check("AsyncEngineArgs", "fields", ("worker_extension_cls", "per_request_spec_decode_metrics",
                                        "kv_cache_memory_bytes", "speculative_config", "max_logprobs",
                                        "additional_config")),
    Check("AsyncLLM", "attrs", ("from_engine_args", "collective_rpc", "generate", "get_tokenizer", "errored",
                                "get_num_unfinished_requests", "shutdown")),
    Check("AsyncLLM", "params", ("self", "method", "timeout", "args", "kwargs"), "collective_rpc"),
    Check("AsyncLLM", "assigns", ("output_handler",)),  # engine_stop cancels it before shutdown
    Check("RequestOutput", "fields", ("prompt_logprobs", "prompt_token_ids", "num_cached_tokens", "outputs",
                                      "finished")),
    Check("CompletionOutput", "fields", ("spec_decode_metrics", "token_ids", "logprobs", "finish_reason",
                                         "stop_reason")),
    Check("RequestSpecDecodeMetrics", "fields", ("histogram", "num_draft_tokens")),
    Check("FlatLogprobs", "fields", ("start_indices", "end_indices", "token_ids", "logprobs", "ranks")),
    Check("Logprob", "fields", ("logprob", "rank", "decoded_token")),  # engine/outputs.py
    Check("TokensPrompt", "fields", ("prompt_token_ids", "cache_salt")),  # engine/manager.py
)


def load(location: str) -> Any:
    """``"module:Name"`` → the object; ``"module"`` → the module."""
    module, _, name = location.partition(":")
    obj = importlib.import_module(module)
    return getattr(obj, name) if name else obj


def field_names(cls: Any) -> set[str]:
    """What a class declares: msgspec Struct fields, dataclass fields, a TypedDict's keys, else ``__init__``
    parameters."""
    struct_fields = getattr(cls, "__struct_fields__", None)
    if struct_fields is not None:
        return set(struct_fields)
    if hasattr(cls, "__optional_keys__"):
        return set(cls.__required_keys__) | set(cls.__optional_keys__)
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    return set(inspect.signature(cls.__init__).parameters) - {"self"}


def _param_names(func: Any) -> tuple[str, ...]:
    return tuple(inspect.signature(func).parameters)


def check_problems(check: Check, cls: Any) -> list[str]:
    """What ``cls`` lacks for one check (empty: it passes)."""
    name = check.target
    if check.kind == "params":
        func = getattr(cls, check.member, None)
        if func is None:
            return [f"{name}.{check.member} no longer exists"]
        try:
            actual = _param_names(func)
        except (TypeError, ValueError) as exc:
            return [f"{name}.{check.member} has no readable signature ({exc})"]
        if actual != check.names:
            return [f"{name}.{check.member}({', '.join(check.names)}) now takes ({', '.join(actual)})"]
        return []
    if check.kind == "fields":
        have = field_names(cls)
        return [f"{name} has no field {field!r}" for field in check.names if field not in have]
    if check.kind == "assigns":
        try:
            source = inspect.getsource(cls.__init__)
        except (OSError, TypeError) as exc:
            return [f"{name}.__init__ has no readable source ({exc})"]
        return [f"{name}.__init__ no longer sets self.{attr}" for attr in check.names
                if not re.search(rf"\bself\.{attr}\s*(:[^=\n]*)?=(?!=)", source)]
    return [f"{name} has no attribute {attr!r}" for attr in check.names if not hasattr(cls, attr)]


def problems(classes: Mapping[str, Any] | None = None, checks: Iterable[Check] = CHECKS,
             version: str | None = None) -> list[str]:
    """Every difference between the installed vLLM and what Cascade relies on (empty: compatible).

    ``classes`` replaces some of the checked objects (tests swap in stand-ins); the others are
    imported from ``CLASSES``. ``version`` replaces the installed version string."""
    found: list[str] = []
    try:
        check_vllm_version(version)
    except IncompatibleVllmError as exc:
        found.append(str(exc))
    given = dict(classes or {})
    resolved: dict[str, Any] = {}
    for check in checks:
        if check.target not in resolved:
            if check.target in given:
                resolved[check.target] = given[check.target]
            else:
                try:
                    resolved[check.target] = load(CLASSES[check.target])
                except Exception as exc:  # an import that fails is itself the problem to report
                    resolved[check.target] = None
                    found.append(f"cannot import {CLASSES[check.target]}: {type(exc).__name__}: {exc}")
        cls = resolved[check.target]
        if cls is not None:
            found.extend(check_problems(check, cls))
    return found


def require_compatible(classes: Mapping[str, Any] | None = None) -> None:
    """Raise ``IncompatibleVllmError`` listing every problem, or return when there is none."""
    found = problems(classes)
    if found:
        raise IncompatibleVllmError("the installed vLLM differs from what Cascade relies on:\n- "
                                    + "\n- ".join(found))
