"""Patches reach the processes of a real multiprocess vLLM run on the reference device.

A child Python process runs ``vllm.LLM`` with the default multiprocess engine: the main
process (platform stage) and the engine-core process, which hosts the worker (worker
stage). Each observes patched behaviour itself: in the main process, strict environment
validation accepts the suite's variables (platform-stage patch ``envs``); in the worker,
a value written to a staging buffer's host tensor is visible on the device side without a
copy (worker-stage patch ``cpu_gpu_buffer.host_buffer_alias``), while in the main process,
where no worker stage runs, it is not.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tiny_models import ensure_tiny_model

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, os, sys


def worker_view(worker):
    import os
    buffer = worker.model_runner.input_ids
    buffer.cpu[0] = 4242
    return {"pid": os.getpid(), "aliased": int(buffer.gpu[0]) == 4242}


def main():
    import torch
    from vllm import LLM
    from vllm.platforms import current_platform
    from vllm.v1.utils import CpuGpuBuffer

    llm = LLM(model=sys.argv[1], dtype="float32", max_model_len=512,
              kv_cache_memory_bytes=32 << 20, enforce_eager=True)
    workers = llm.collective_rpc(worker_view)
    try:
        current_platform.validate_environ(hard_fail=True)
        strict_environment = True
    except ValueError:
        strict_environment = False
    buffer = CpuGpuBuffer(2, dtype=torch.int32, device=torch.device("cpu"), pin_memory=False)
    buffer.cpu[0] = 4242
    llm.llm_engine.engine_core.shutdown()
    print("RESULT " + json.dumps({
        "pid": os.getpid(),
        "workers": workers,
        "strict_environment": strict_environment,
        "aliased": int(buffer.gpu[0]) == 4242,
    }))


if __name__ == "__main__":
    main()
"""


def test_stages_reach_main_and_worker_processes(tmp_path) -> None:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {
        **os.environ,
        "VLLM_ASCEND_DEVICE": "cpu",
        "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",  # collective_rpc of a function, locally
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
    }
    result = subprocess.run(
        [sys.executable, str(script), str(ensure_tiny_model("llama"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    lines = [ln for ln in result.stdout.splitlines() if ln.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-4000:]
    seen = json.loads(lines[-1][len("RESULT ") :])
    (worker,) = seen["workers"]
    assert worker["pid"] != seen["pid"]  # the worker is another process
    assert worker["aliased"] is True  # worker stage applied in the worker
    assert seen["strict_environment"] is True  # platform stage applied in the main process
    assert seen["aliased"] is False  # the worker stage did not run in the main process
