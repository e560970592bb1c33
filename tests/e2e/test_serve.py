"""``vllm serve`` with the suite active answers the OpenAI completion and chat APIs.

The server runs as a child process on loopback with ``VLLM_ASCEND_DEVICE=cpu``; the test
stops it (its whole process group) by PID. Greedy answers are checked against HF
Transformers, and streamed answers against the non-streamed ones.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from references import hf_greedy
from tiny_models import ensure_tiny_model

pytestmark = pytest.mark.slow

NEW_TOKENS = 16
VLLM_CLI = Path(__file__).with_name("vllm_cli.py")
STARTUP_SECONDS = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    model = ensure_tiny_model("llama")
    port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "server.log"
    env = {**os.environ, "VLLM_ASCEND_DEVICE": "cpu"}
    command = [
        sys.executable, str(VLLM_CLI), "serve", str(model),
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
        "--max-model-len", "1024", "--kv-cache-memory-bytes", str(64 << 20),
        "--served-model-name", "tiny-llama",
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while True:
            if process.poll() is not None:
                pytest.fail(f"vllm serve exited early:\n{log_path.read_text()[-4000:]}")
            try:
                if requests.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve not up in {STARTUP_SECONDS}s:\n{log_path.read_text()}")
            time.sleep(1)
        yield base, log_path
    finally:
        _stop(process)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def _stream(url: str, body: dict) -> list[dict]:
    chunks = []
    with requests.post(url, json={**body, "stream": True}, stream=True, timeout=120) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                chunks.append(json.loads(line[len(b"data: ") :]))
    return chunks


def _tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_tiny_model("llama"))


def test_server_runs_on_the_ascend_platform(server: tuple[str, Path]) -> None:
    _, log_path = server
    log = log_path.read_text()
    assert "Unknown vLLM environment variable" not in log
    # Once in the API server (config check) and once in the engine core process.
    assert log.count("Ascend platform active on the CPU reference device") >= 2, log


def test_completions_match_transformers(server: tuple[str, Path]) -> None:
    base, _ = server
    prompt = [5, 17, 300, 41, 999, 12, 7]
    body = {
        "model": "tiny-llama",
        "prompt": prompt,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = requests.post(f"{base}/v1/completions", json=body, timeout=120)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    text = choice["text"]
    assert choice["token_ids"] == hf_greedy("llama", [prompt], NEW_TOKENS)[0]
    streamed = "".join(c["choices"][0]["text"] for c in _stream(f"{base}/v1/completions", body))
    assert streamed == text


def test_chat_completions_match_transformers(server: tuple[str, Path]) -> None:
    base, _ = server
    messages = [{"role": "user", "content": "hello there, how are you"}]
    body = {
        "model": "tiny-llama",
        "messages": messages,
        "max_tokens": NEW_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    response = requests.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    response.raise_for_status()
    choice = response.json()["choices"][0]
    content = choice["message"]["content"]
    # vLLM renders the chat template and tokenizes the text without special tokens.
    tokenizer = _tokenizer()
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    prompt_ids = tokenizer(rendered, add_special_tokens=False).input_ids
    assert choice["token_ids"] == hf_greedy("llama", [prompt_ids], NEW_TOKENS)[0]
    chunks = _stream(f"{base}/v1/chat/completions", body)
    streamed = "".join(
        c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]
    )
    assert streamed == content
