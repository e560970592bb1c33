"""The ops under torch.compile: traced whole through the kernels' fake implementations.

A decoder-layer-shaped block (norm with residual, rotary embedding on fused-qkv views,
SwiGLU) compiled with ``fullgraph=True`` (no graph break allowed) and dynamic token
counts, with the dynamo backends the platform uses (``eager``) and one that also runs
AOTAutograd's functionalisation (``aot_eager``); the captured graph must hold the
torch_npu ops as single nodes, and the compiled block must give bit-identical results to
the eager one for several token counts.
"""

from __future__ import annotations

import pytest
import torch
from ascend_ops.ops import AscendRMSNorm, AscendRotaryEmbedding, AscendSiluAndMul
from ascend_platform.kernels.library import call_counts
from op_checks import vllm_config

HIDDEN, HEADS, KV_HEADS, HEAD = 64, 4, 2, 16
NPU_OPS = {"npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_rotary_mul"}


class Block(torch.nn.Module):
    def __init__(self, neox: bool) -> None:
        super().__init__()
        self.norm = AscendRMSNorm(HIDDEN, eps=1e-6)
        self.post_norm = AscendRMSNorm(HIDDEN, eps=1e-6)
        self.rope = AscendRotaryEmbedding(HEAD, HEAD, 256, 10000.0, neox, torch.float32)
        self.act = AscendSiluAndMul()
        gen = torch.Generator().manual_seed(0)
        self.qkv = torch.nn.Parameter(
            torch.randn(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD, generator=gen)
        )
        self.up = torch.nn.Parameter(torch.randn(HIDDEN, 4 * HIDDEN, generator=gen) * 0.1)
        self.down = torch.nn.Parameter(torch.randn(2 * HIDDEN, HIDDEN, generator=gen) * 0.1)

    def forward(self, positions: torch.Tensor, x: torch.Tensor):
        h = self.norm(x)
        q, k, v = (h @ self.qkv).split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], -1)
        q, k = self.rope(positions, q, k)
        h, residual = self.post_norm(q[:, :HIDDEN] + v.repeat(1, 2)[:, :HIDDEN], x)
        out = self.act(h @ self.up) @ self.down
        return out, residual, k


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
@pytest.mark.parametrize("neox", [True, False])
def test_compiled_block_equals_eager(backend: str, neox: bool) -> None:
    torch._dynamo.reset()
    with vllm_config():
        block = Block(neox)
    for layer in (block.norm, block.post_norm, block.rope, block.act):
        assert layer._forward_method.__name__ == "forward_oot"

    graphs: list[torch.fx.GraphModule] = []

    def capture(gm: torch.fx.GraphModule, example_inputs):
        graphs.append(gm)
        if backend == "eager":
            return gm.forward
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    compiled = torch.compile(block, backend=capture, fullgraph=True, dynamic=True)
    with torch.inference_mode():
        for tokens in (7, 33, 2):  # (dynamo specialises size 1)
            gen = torch.Generator().manual_seed(tokens)
            x = torch.randn(tokens, HIDDEN, generator=gen)
            positions = torch.randint(0, 256, (tokens,), generator=gen)
            expected = block(positions, x)
            before = call_counts()
            got = compiled(positions, x)
            after = call_counts()
            if tokens == 7:
                first_graphs = len(graphs)
            for g, e in zip(got, expected, strict=True):
                torch.testing.assert_close(g, e, rtol=0, atol=0)
            ran = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
            assert ran == {
                "npu_rms_norm": 1,
                "npu_add_rms_norm": 1,
                "npu_rotary_mul": 2,
                "npu_swiglu": 1,
            }
    # Dynamic token counts: no recompilation after the first call. (Dynamo may trace
    # twice on the first call, e.g. once more after specialising float attributes.)
    assert len(graphs) == first_graphs
    targets = {
        str(node.target).removeprefix("npu.").split(".")[0]
        for node in graphs[-1].graph.nodes
        if node.op == "call_function"
    }
    assert targets >= NPU_OPS, targets
