"""Cascade: an OpenAI-compatible gateway over vLLM with predicted outputs, an LLM codec and k-CBS."""

__version__ = "0.1.0"
