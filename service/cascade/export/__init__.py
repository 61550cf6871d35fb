"""Teacher-forced top-k export: processed, renormalised next-token distributions for a given text."""
