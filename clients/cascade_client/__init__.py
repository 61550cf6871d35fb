"""Python client for Cascade (streaming first): ``CascadeClient`` and the ``cascade`` CLI."""

from cascade_client.client import CascadeClient, CascadeError, CompressStats

__all__ = ["CascadeClient", "CascadeError", "CompressStats"]
