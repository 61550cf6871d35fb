"""Python client for Cascade (streaming first): ``CascadeClient``, ``AsyncCascadeClient``, the ``cascade`` CLI.

Both clients share one protocol layer (``cascade_client.protocol``): the same methods, arguments,
typed results and typed exceptions, sync or awaited.
"""

from cascade_client.aio import AsyncCascadeClient
from cascade_client.client import CascadeClient
from cascade_client.protocol import (
    AuthenticationError,
    BadRequestError,
    CascadeConnectionError,
    CascadeError,
    CompressStats,
    DecompressStats,
    IntegrityError,
    KcbsResult,
    KcbsSequence,
    ModelMismatchError,
    NotFoundError,
    PayloadTooLargeError,
    Progress,
    RateLimitError,
    ServerError,
    ServiceUnavailableError,
    TargetMatch,
)
from cascade_client.retry import RetryPolicy
from cascade_client.topk_document import TopkDocument
from cascade_client.topk_export import ExportStats

__all__ = [
    "AsyncCascadeClient",
    "AuthenticationError",
    "BadRequestError",
    "CascadeClient",
    "CascadeConnectionError",
    "CascadeError",
    "CompressStats",
    "DecompressStats",
    "ExportStats",
    "IntegrityError",
    "KcbsResult",
    "KcbsSequence",
    "ModelMismatchError",
    "NotFoundError",
    "PayloadTooLargeError",
    "Progress",
    "RateLimitError",
    "RetryPolicy",
    "ServerError",
    "ServiceUnavailableError",
    "TargetMatch",
    "TopkDocument",
]
