"""The Ascend worker and model runner (one implementation for the NPU and the reference device)."""
