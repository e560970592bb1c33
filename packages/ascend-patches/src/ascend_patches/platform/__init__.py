"""Patches applied in the main process (platform stage)."""
