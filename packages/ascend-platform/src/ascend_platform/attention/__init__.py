"""The Ascend attention backend."""
