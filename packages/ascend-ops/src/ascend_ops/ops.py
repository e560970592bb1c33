"""vLLM layers whose ``forward_oot`` runs on torch_npu kernels.

Each class subclasses vLLM's own layer and is installed with ``CustomOp.register_oot``:
from then on, constructing vLLM's class (``RMSNorm(...)``) builds ours, and vLLM's
``CustomOp.dispatch_forward`` picks ``forward_oot`` because the Ascend platform is an
out-of-tree platform. Which layers are replaced, and by which kernels:

=====================  ==================  ==============================================
vLLM class             custom_ops name     torch_npu kernels
=====================  ==================  ==============================================
``RMSNorm``            ``rms_norm``        ``npu_rms_norm``, ``npu_add_rms_norm``
``SiluAndMul``         ``silu_and_mul``    ``npu_swiglu``
``RotaryEmbedding``    ``rotary_embedding``  ``npu_rotary_mul`` (neox and gpt-j styles)
=====================  ==================  ==============================================

How this meets vLLM 0.32's switches:

* ``compilation_config.custom_ops``: ``register_oot`` renames the registered class to the
  registry key (``"RMSNorm"``), which would make ``-rms_norm`` miss it. :func:`register_ops`
  gives each class back the in-tree op name, so ``CustomOp.enabled()`` reads the same
  ``+name`` / ``-name`` entries as for vLLM's class, and a disabled op runs vLLM's
  ``forward_native`` unchanged.
* vLLM IR (``kernel_config.ir_op_priority``): vLLM's ``RMSNorm.forward_native`` calls the IR
  ops ``vllm.ir.ops.rms_norm`` / ``fused_add_rms_norm``; the replaced ``forward_oot`` does
  not go through them, so the IR priority only governs the native (disabled) path.
* ``torch.compile``: the kernels are ``torch.ops.npu.*`` ops with fake implementations
  (torch_npu's, or the platform's on the reference device), so dynamo records them as
  single graph nodes; all branching here depends only on layer attributes and dtypes.

The kernels are looked up by op name at call time, ``torch.ops.npu.<name>``: torch_npu
defines them on an NPU host, the Ascend platform's kernel layer on the reference device
(the worker registers them in ``init_device``, before the model is built). Nothing here
imports torch_npu or ascend_platform.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.model_executor.custom_op import CustomOp, op_registry_oot
from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

logger = init_logger("vllm.ascend_ops")

__all__ = [
    "KERNELS",
    "AscendRMSNorm",
    "AscendRotaryEmbedding",
    "AscendSiluAndMul",
    "oot_classes",
    "register_ops",
]

KERNELS: dict[str, tuple[str, ...]] = {
    "rms_norm": ("npu_rms_norm", "npu_add_rms_norm"),
    "silu_and_mul": ("npu_swiglu",),
    "rotary_embedding": ("npu_rotary_mul",),
}
"""custom_ops name -> the torch_npu kernels its ``forward_oot`` calls."""


class AscendRMSNorm(RMSNorm):
    """vLLM's ``RMSNorm`` on ``npu_rms_norm`` and, with a residual, ``npu_add_rms_norm``.

    With a residual the result is ``(norm(x + residual), x + residual)``, as vLLM's
    ``forward_native`` returns it: the sum is formed in float32, returned in x's dtype,
    and normalised in float32. The call is functional: ``x`` and ``residual`` are not
    modified (vLLM's callers use only the returned tensors; its native path does not
    write into its inputs either).

    Falls back to ``forward_native`` where the kernels do not apply: a variance over a
    prefix of the hidden dim (``var_hidden_size``), no weight, a weight or residual of
    another dtype than ``x``.
    """

    def _npu_applies(self, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
        return (
            self.variance_size_override is None
            and self.has_weight
            and self.weight.dtype == x.dtype
            and (residual is None or residual.dtype == x.dtype)
        )

    def forward_oot(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        if not self._npu_applies(x, residual):
            return self.forward_native(x, residual)
        if residual is None:
            out, _rstd = torch.ops.npu.npu_rms_norm(x, self.weight.data, self.variance_epsilon)
            return out
        out, _rstd, added = torch.ops.npu.npu_add_rms_norm(
            x, residual, self.weight.data, self.variance_epsilon
        )
        return out, added


class AscendSiluAndMul(SiluAndMul):
    """vLLM's ``SiluAndMul`` on ``npu_swiglu``: ``silu(x[..., :d]) * x[..., d:]``.

    ``npu_swiglu(x, dim=-1)`` splits the last dim into halves A, B and returns
    ``A * sigmoid(A) * B``, exactly vLLM's definition, in one kernel.
    """

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.npu.npu_swiglu(x, -1)


def rotary_tables(
    cos_sin_cache: torch.Tensor, is_neox_style: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``npu_rotary_mul``'s r1 (cos) and r2 (sin) tables from vLLM's ``cos_sin_cache``.

    vLLM's cache row is ``[cos_0 .. cos_{h-1}, sin_0 .. sin_{h-1}]`` (h = rotary_dim / 2).
    The kernel multiplies element-wise over the full rotary dim, so each frequency's value
    must stand at both positions it rotates: ``[cos, cos]`` for the neox ("half") layout,
    ``[cos_0, cos_0, cos_1, cos_1, ...]`` for the gpt-j ("interleave") layout.
    """
    cos, sin = cos_sin_cache.chunk(2, dim=-1)
    if is_neox_style:
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
    return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)


class AscendRotaryEmbedding(RotaryEmbedding):
    """vLLM's ``RotaryEmbedding`` (neox and gpt-j styles) on ``npu_rotary_mul``.

    Why ``npu_rotary_mul`` and not ``npu_apply_rotary_pos_emb``: on the Atlas A2/A3
    products this suite targets, torch_npu 2.13.0 documents ``npu_apply_rotary_pos_emb``
    for ``rotary_mode="half"`` only and for a head dim of exactly 64 or 128, so it cannot
    serve gpt-j style rope, partial rotary dims, or small heads (the tiny test models have
    head_dim 32). ``npu_rotary_mul`` takes both ``"half"`` (neox) and ``"interleave"``
    (gpt-j) for any even D < 896 in the BSND layout with 1S1D cos/sin, which is how tokens
    are laid out here: ``[1, num_tokens, num_heads, rotary_dim]``. The price is one call
    for the query and one for the key instead of one fused in-place call, and cos/sin
    tables at the full rotary width (built once, :func:`rotary_tables`; two buffers of
    ``max_position x rotary_dim`` in the cache dtype). The result is out of place, like
    vLLM's ``forward_native``; callers use the returned tensors.

    With ``rotary_dim < head_size`` only the first ``rotary_dim`` channels of each head
    are rotated and the rest pass through, as in vLLM.
    """

    def __init__(
        self,
        head_size: int,
        rotary_dim: int,
        max_position_embeddings: int,
        base: float,
        is_neox_style: bool,
        dtype: torch.dtype,
        init_cache: bool = True,
    ) -> None:
        super().__init__(
            head_size=head_size,
            rotary_dim=rotary_dim,
            max_position_embeddings=max_position_embeddings,
            base=base,
            is_neox_style=is_neox_style,
            dtype=dtype,
            init_cache=init_cache,
        )
        self.has_npu_tables = init_cache
        if init_cache:
            r1, r2 = rotary_tables(self.cos_sin_cache, is_neox_style)
            self.npu_cos_cache: torch.Tensor
            self.npu_sin_cache: torch.Tensor
            self.register_buffer("npu_cos_cache", r1, persistent=False)
            self.register_buffer("npu_sin_cache", r2, persistent=False)

    def _npu_tables(self, query: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.npu_cos_cache, self.npu_sin_cache
        if cos.device == query.device and cos.dtype == query.dtype:
            return cos, sin
        cos = cos.to(query.device, dtype=query.dtype)
        sin = sin.to(query.device, dtype=query.dtype)
        if not torch.compiler.is_compiling():  # no buffer mutation while tracing
            self.npu_cos_cache, self.npu_sin_cache = cos, sin
        return cos, sin

    def _rotate(
        self, x: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor, num_tokens: int
    ) -> torch.Tensor:
        mode = "half" if self.is_neox_style else "interleave"
        shape = x.shape
        x = x.view(num_tokens, -1, self.head_size)
        if self.rotary_dim == self.head_size:
            out = torch.ops.npu.npu_rotary_mul(x.unsqueeze(0), r1, r2, mode)
            return out.reshape(shape)
        rot = torch.ops.npu.npu_rotary_mul(x[..., : self.rotary_dim].unsqueeze(0), r1, r2, mode)
        return torch.cat((rot.squeeze(0), x[..., self.rotary_dim :]), dim=-1).reshape(shape)

    def forward_oot(
        self,
        positions: torch.Tensor,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not self.has_npu_tables:
            return self.forward_native(positions, query, key)
        positions = positions.flatten()
        num_tokens = positions.shape[0]
        cos_table, sin_table = self._npu_tables(query)
        # [1, T, 1, rotary_dim]: the 1S1D layout npu_rotary_mul broadcasts over heads.
        r1 = cos_table.index_select(0, positions)[None, :, None, :]
        r2 = sin_table.index_select(0, positions)[None, :, None, :]
        query = self._rotate(query, r1, r2, num_tokens)
        if key is not None:
            key = self._rotate(key, r1, r2, num_tokens)
        return query, key


def oot_classes() -> tuple[tuple[type[CustomOp], type[CustomOp]], ...]:
    """(vLLM class, our class) pairs that :func:`register_ops` installs."""
    return (
        (RMSNorm, AscendRMSNorm),
        (SiluAndMul, AscendSiluAndMul),
        (RotaryEmbedding, AscendRotaryEmbedding),
    )


def register_ops() -> list[str]:
    """Install the classes with ``CustomOp.register_oot`` (idempotent); returns the keys.

    A key another plugin already holds with a different class is left alone, with a
    warning: two out-of-tree replacements of one layer cannot both win.
    """
    installed = []
    for base, ours in oot_classes():
        key = base.__name__
        current = op_registry_oot.get(key)
        if current is None:
            base.register_oot(ours)
        elif current is not ours:
            logger.warning(
                "Not replacing vLLM's %s with %s: %s is registered for it already.",
                key,
                ours.__name__,
                current.__qualname__,
            )
            continue
        # register_oot sets ours.name to the registry key ("RMSNorm"); custom_ops entries
        # ("-rms_norm") and vLLM's enabled/disabled op bookkeeping use the in-tree name.
        ours.name = base.name
        installed.append(key)
    logger.debug("Ascend ops registered: %s", ", ".join(installed))
    return installed
