"""LLM arithmetic codec: pure core (distribution, coder, container, segmenter) and its vLLM adapter."""
