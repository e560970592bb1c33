"""Patches applied in worker processes (worker stage) and in every vLLM process (process stage)."""
