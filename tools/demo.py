"""Generate text from a tiny random-weight Llama through vLLM with the Ascend suite.

Run by ``bash tools/dev.sh demo`` (which sets ``VLLM_ASCEND_DEVICE=cpu``): vLLM resolves
the Ascend platform on the CPU reference device, serves the model with the suite's
worker, runner, attention backend and reference kernels, and this script prints the
generated text and which platform served it. The weights are random, so the text is
gibberish; what matters is the path it took.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tiny_models import ensure_tiny_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", default="Tell me about Ascend NPUs.")
    parser.add_argument("--max-tokens", type=int, default=24)
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ASCEND_DEVICE", "cpu")

    from vllm import LLM, SamplingParams
    from vllm.platforms import current_platform

    model = ensure_tiny_model("llama")
    llm = LLM(model=str(model), dtype="float32", max_model_len=1024, kv_cache_memory_bytes=64 << 20)
    messages = [{"role": "user", "content": args.prompt}]
    outputs = llm.chat(messages, SamplingParams(temperature=0.0, max_tokens=args.max_tokens))
    llm.llm_engine.engine_core.shutdown()  # stop the engine before reporting
    platform = type(current_platform)
    print()
    print(f"platform : {platform.__module__}.{platform.__name__}")
    print(f"device   : {current_platform.device_type} ({current_platform.get_device_name()})")
    print(f"model    : {model.name} (tiny random-weight LlamaForCausalLM)")
    print(f"prompt   : {args.prompt}")
    print(f"output   : {outputs[0].outputs[0].text!r}")


if __name__ == "__main__":
    main()
