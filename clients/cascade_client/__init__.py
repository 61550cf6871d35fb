"""Python client for Cascade (sync and async, streaming first)."""
