"""How the gateway marks requests for Cascade's in-engine code (``SamplingParams.extra_args``).

Torch- and vLLM-free: the gateway imports this; the engine-side modules read the same keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

EXPORT_KEY = "cascade_export"
PREDICTION_KEY = "cascade_prediction"
RESPONSE_CACHE_KEY = "cascade_response_cache_tokens"  # of the prediction engine's ``additional_config``
DRAFT_CROWDING_KEY = "cascade_draft_crowding"  # of the prediction engine's ``additional_config``
DATASTORE_MIB_KEY = "cascade_datastore_mib"  # of the prediction engine's ``additional_config``
DATASTORE_DIR_KEY = "cascade_datastore_dir"  # of the prediction engine's ``additional_config``


def export_extra_args() -> dict[str, Any]:
    """``extra_args`` of a top-k export request (its prompt logits go through the sampling stack)."""
    return {EXPORT_KEY: True}


def is_export_request(sampling_params: Any) -> bool:
    """Whether a request's ``SamplingParams`` carry the export marker."""
    extra = getattr(sampling_params, "extra_args", None) or {}
    return bool(extra.get(EXPORT_KEY))


def prediction_extra_args(token_ids: Sequence[int], mode: str, adaptive: bool = True,
                          scope: str = "") -> dict[str, Any]:
    """``extra_args`` of a request with a prediction, read by the static-text proposer
    (``adaptive=False``: always draft K tokens, for benchmarks; ``scope``: whose earlier responses
    it drafts from and joins)."""
    return {PREDICTION_KEY: {"ids": list(token_ids), "mode": mode, "adaptive": adaptive, "scope": scope}}


def prediction_spec(sampling_params: Any) -> dict[str, Any] | None:
    """The prediction a request carries (``prediction_extra_args``' value), or None."""
    spec = (getattr(sampling_params, "extra_args", None) or {}).get(PREDICTION_KEY)
    return spec or None
