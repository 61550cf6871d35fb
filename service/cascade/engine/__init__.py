"""The vLLM engines Cascade drives and how requests reach them."""
