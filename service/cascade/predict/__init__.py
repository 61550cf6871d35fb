"""Smart predicted outputs: static-text speculative proposer (pure core) and its vLLM adapter."""
