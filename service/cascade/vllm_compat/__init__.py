"""Everything Cascade touches inside vLLM, in one place, pinned to one vLLM release.

- ``version``: the exact pin and ``IncompatibleVllmError``.
- ``contract``: static checks of every vLLM surface Cascade relies on (``require_compatible()``).
- ``request_keys``: how the gateway marks export and prediction requests (torch/vLLM-free).
- ``worker_extension``: the RPC methods mixed into vLLM's worker (live state, hook installation).
- ``export_hook`` / ``export_processing``: export requests' prompt logits through the sampling stack.
- ``bind_batch_hook`` / ``proposer``: the static-text speculative proposer and its row binding.
- ``engine_stop``: an engine's output reader cancelled before it stops.

Importing this package (or ``request_keys``, ``version``, ``worker_extension``) imports neither
torch nor vLLM.
"""

from cascade.vllm_compat.request_keys import (
    EXPORT_KEY,
    PREDICTION_KEY,
    export_extra_args,
    is_export_request,
    prediction_extra_args,
)
from cascade.vllm_compat.version import PINNED_VLLM, IncompatibleVllmError, check_vllm_version
from cascade.vllm_compat.worker_extension import (
    HOOKS,
    INSTALL_HOOKS_RPC,
    LIVE_STATE_RPC,
    WORKER_EXTENSION,
    check_installed,
    install_engine_hooks,
    merge_counts,
)

__all__ = [
    "EXPORT_KEY",
    "HOOKS",
    "INSTALL_HOOKS_RPC",
    "LIVE_STATE_RPC",
    "PINNED_VLLM",
    "PREDICTION_KEY",
    "WORKER_EXTENSION",
    "IncompatibleVllmError",
    "check_installed",
    "check_vllm_version",
    "export_extra_args",
    "install_engine_hooks",
    "is_export_request",
    "merge_counts",
    "prediction_extra_args",
]
