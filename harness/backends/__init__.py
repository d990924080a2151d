"""Backends: `local` (plain PyTorch engines) and `verl` (verl + vLLM on GPU clusters)."""
