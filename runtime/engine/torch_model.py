"""A Llama-architecture decoder in torch for the torch executor: RMSNorm, rotary embeddings,
grouped-query attention over a paged KV cache, SwiGLU MLP.

The model computes; the paged KV cache and the per-iteration attention plan are handed in by the
executor (:mod:`runtime.engine.torch_executor`), which owns both. Weights are random (seeded) by
default, since iteration time does not depend on their values, or read from a local safetensors
checkpoint in the Hugging Face layout (:func:`load_safetensors`).

Conventions follow the Hugging Face ``LlamaForCausalLM`` so that its checkpoints load unchanged:
rotary embeddings rotate the two halves of each head (``rotate_half``), KV head ``j`` serves query
heads ``j*group .. (j+1)*group-1``, norms are computed in fp32 and the MLP is
``down(silu(gate(x)) * up(x))``. The q/k/v and gate/up projections are stored fused (one GEMM
each instead of three and two); the loader concatenates the checkpoint's separate matrices.

This module imports torch; only the torch executor imports it, so the rest of ``runtime`` installs
without torch.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from runtime.engine.roofline import MODELS, ModelShape

if TYPE_CHECKING:
    from runtime.engine.torch_kv import AttentionPlan, PagedKVCache, RaggedDecodeRun


DECODE_ATTENTION = ("ragged", "sdpa")
"""the decode attention implementations (see :class:`LlamaModel`)"""


@dataclass(frozen=True, slots=True)
class LlamaConfig:
    """The shape of a Llama-architecture decoder."""

    vocab_size: int
    """tokens in the vocabulary (rows of the embedding and of the LM head)"""
    hidden_size: int
    """width of the residual stream"""
    intermediate_size: int
    """width of the SwiGLU MLP"""
    num_layers: int
    """decoder layers"""
    num_heads: int
    """query heads"""
    num_kv_heads: int
    """key/value heads (grouped-query attention when fewer than ``num_heads``)"""
    rope_theta: float = 10000.0
    """base of the rotary frequencies"""
    rms_norm_eps: float = 1e-5
    """epsilon inside RMSNorm"""
    max_position: int = 16384
    """positions the rotary table covers (the engine's ``max_model_len``)"""
    tie_word_embeddings: bool = False
    """the LM head reuses the embedding matrix"""
    name: str = "custom"
    """a label written into profiles"""

    def __post_init__(self) -> None:
        for f in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                  "num_kv_heads", "max_position"):
            if getattr(self, f) < 1:
                raise ValueError(f"LlamaConfig.{f} must be >= 1, got {getattr(self, f)}")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not a multiple of "
                             f"num_heads={self.num_heads}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of "
                             f"num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_params(self) -> int:
        h, i, v, hd = self.hidden_size, self.intermediate_size, self.vocab_size, self.head_dim
        attn = h * (self.num_heads + 2 * self.num_kv_heads) * hd + self.num_heads * hd * h
        per_layer = attn + 3 * h * i + 2 * h
        heads = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + heads + h

    @property
    def matmul_params(self) -> int:
        """Parameters every token multiplies through (the embedding lookup excluded): the FLOPs
        of one token's forward are about twice this."""
        return self.num_params - self.vocab_size * self.hidden_size * (
            0 if self.tie_word_embeddings else 1) - (2 * self.num_layers + 1) * self.hidden_size

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "head_dim": self.head_dim, "params": self.num_params}

    @classmethod
    def from_hf(cls, hf: dict[str, Any], name: str = "hf") -> LlamaConfig:
        """From a Hugging Face ``config.json`` of a Llama model."""
        try:
            return cls(vocab_size=int(hf["vocab_size"]), hidden_size=int(hf["hidden_size"]),
                       intermediate_size=int(hf["intermediate_size"]),
                       num_layers=int(hf["num_hidden_layers"]),
                       num_heads=int(hf["num_attention_heads"]),
                       num_kv_heads=int(hf.get("num_key_value_heads", hf["num_attention_heads"])),
                       rope_theta=float(hf.get("rope_theta", 10000.0)),
                       rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
                       max_position=int(hf.get("max_position_embeddings", 16384)),
                       tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)), name=name)
        except KeyError as e:
            raise ValueError(f"Hugging Face config lacks field {e.args[0]!r}") from None


TINY = LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_layers=2,
                   num_heads=4, num_kv_heads=2, max_position=4096, name="tiny")
"""The CPU test configuration: about 0.4 M parameters, GQA with two query heads per KV head."""
CPU_SUFFIX = "-cpu"
"""a shape's name with this suffix is its scaled-down CPU version"""
CPU_HEAD_DIM = 8
"""head width of the scaled-down shapes"""
CPU_CONTEXT = 4096
"""context of the scaled-down shapes (a prefill gathers one layer's KV for all of it)"""


def shape_config(shape: ModelShape, key: str) -> LlamaConfig:
    """The full-size decoder of a catalogue shape (:data:`runtime.engine.roofline.MODELS`)."""
    return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden,
                       intermediate_size=shape.intermediate, num_layers=shape.layers,
                       num_heads=shape.heads, num_kv_heads=shape.kv_heads,
                       rope_theta=shape.rope_theta, max_position=shape.max_model_len, name=key)


def scaled_down_config(shape: ModelShape, key: str) -> LlamaConfig:
    """A CPU-sized decoder with the same attention layout as a catalogue shape: the same query
    and KV heads (so the same GQA grouping) and rotary base, with heads of
    :data:`CPU_HEAD_DIM`, two layers, the same MLP-to-hidden ratio, a 512-token vocabulary and
    a :data:`CPU_CONTEXT`-token context."""
    hidden = shape.heads * CPU_HEAD_DIM
    return LlamaConfig(vocab_size=512, hidden_size=hidden,
                       intermediate_size=round(hidden * shape.intermediate / shape.hidden),
                       num_layers=2, num_heads=shape.heads, num_kv_heads=shape.kv_heads,
                       rope_theta=shape.rope_theta,
                       max_position=min(CPU_CONTEXT, shape.max_model_len), name=key + CPU_SUFFIX)


SHAPES: dict[str, LlamaConfig] = {
    "tiny": TINY,
    **{key: shape_config(m, key) for key, m in MODELS.items()},
    **{key + CPU_SUFFIX: scaled_down_config(m, key) for key, m in MODELS.items()},
}
"""the torch executor's shapes by name: ``tiny``, every catalogue model at full size (random
weights by default, or its safetensors checkpoint) and its scaled-down ``-cpu`` version"""
LLAMA2_7B = SHAPES["llama2-7b"]
"""Llama-2-7B: 6.74 B parameters, 512 KiB of KV per token in bf16."""


def token_ids(req_ids: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Deterministic stand-in token ids: a hash of (request id, position).

    The engine does not keep token values (timing does not depend on them), so the executor and
    the tests both derive the token at every position from this one function.
    """
    h = req_ids.to(torch.int64) * 1000003 + positions.to(torch.int64) * 7919 + 12345
    return torch.remainder(h * 2654435761 % 4294967291, vocab_size)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # fp32 statistics, as the HF implementation does, so bf16 runs stay close to fp32 ones
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class LlamaLayer(nn.Module):
    input_norm: nn.Parameter
    qkv_proj: nn.Parameter
    o_proj: nn.Parameter
    post_norm: nn.Parameter
    gate_up_proj: nn.Parameter
    down_proj: nn.Parameter

    def __init__(self, cfg: LlamaConfig, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        qkv = (cfg.num_heads + 2 * cfg.num_kv_heads) * hd

        def p(*shape: int) -> nn.Parameter:
            return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype),
                                requires_grad=False)

        self.input_norm = p(h)
        self.qkv_proj = p(qkv, h)
        self.o_proj = p(h, cfg.num_heads * hd)
        self.post_norm = p(h)
        self.gate_up_proj = p(2 * cfg.intermediate_size, h)
        self.down_proj = p(h, cfg.intermediate_size)


class LlamaModel(nn.Module):
    """:param cfg: the model shape
    :param device: where the weights live
    :param dtype: the weight and activation dtype (bf16 on CUDA, fp32 on the CPU)
    :param seed: seed of the random weights
    :param decode_attention: ``"sdpa"`` (length-sorted groups padded to their longest, one
        fused SDPA call each; the CUDA default) or ``"ragged"`` (no padding: pages of every
        sequence's own context, segment softmax; the CPU default, where its cost follows the
        summed context that the cost model prices, not sequences x the longest context)
    """

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def typed_layers(self) -> list[LlamaLayer]:
        """The decoder layers, typed (``nn.ModuleList`` yields plain modules)."""
        return cast("list[LlamaLayer]", self.layers)

    def __init__(self, cfg: LlamaConfig, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.float32, seed: int = 0,
                 decode_attention: str | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        if decode_attention is None:
            decode_attention = "sdpa" if torch.device(device).type == "cuda" else "ragged"
        if decode_attention not in DECODE_ATTENTION:
            raise ValueError(f"decode_attention must be one of {DECODE_ATTENTION}, "
                             f"got {decode_attention!r}")
        self.decode_attention = decode_attention
        device = torch.device(device)
        self.device, self.dtype = device, dtype
        self.embed = nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size, device=device,
                                              dtype=dtype), requires_grad=False)
        self.layers = nn.ModuleList(LlamaLayer(cfg, device, dtype) for _ in range(cfg.num_layers))
        self.norm = nn.Parameter(torch.empty(cfg.hidden_size, device=device, dtype=dtype),
                                 requires_grad=False)
        self.lm_head = (self.embed if cfg.tie_word_embeddings else
                        nn.Parameter(torch.empty(cfg.vocab_size, cfg.hidden_size, device=device,
                                                 dtype=dtype), requires_grad=False))
        self.randomize(seed)
        # Rotary table in fp32, gathered per iteration by position.
        inv = 1.0 / cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device,
                                                    dtype=torch.float32) / cfg.head_dim)
        freqs = torch.outer(torch.arange(cfg.max_position, device=device, dtype=torch.float32), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("rope_cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("rope_sin", emb.sin().to(dtype), persistent=False)

    @torch.no_grad()
    def randomize(self, seed: int) -> None:
        """Fill the weights from a seeded normal (std 0.02, the Llama initialiser) and the norms
        with ones. Drawn on the weights' device, so a 7B model initialises in seconds on CUDA."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        for name, prm in self.named_parameters():
            if name.endswith("norm"):
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, 0.02, generator=g)

    @property
    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.parameters())

    # ------------------------------------------------------------------ paged forward
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, plan: AttentionPlan,
                kv: PagedKVCache) -> torch.Tensor:
        """One packed iteration: ``input_ids`` and ``positions`` hold the decode tokens first
        (``plan.num_decodes``, in the plan's order), then the prefill chunks back to back.
        Writes every token's K/V into the cache at ``plan.slots`` and returns the logits of the
        rows in ``plan.sample_rows`` (fp32, ``[len(sample_rows), vocab]``)."""
        cfg = self.cfg
        hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        cos = self.rope_cos[positions].unsqueeze(1)
        sin = self.rope_sin[positions].unsqueeze(1)
        h = F.embedding(input_ids, self.embed)
        for li, layer in enumerate(self.typed_layers()):
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            qkv = F.linear(x, layer.qkv_proj)
            q, k, v = qkv.split((nh * hd, nkv * hd, nkv * hd), dim=-1)
            q = q.view(-1, nh, hd)
            k = k.view(-1, nkv, hd)
            v = v.view(-1, nkv, hd)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            kv.write(li, plan, k, v)
            attn = self._attention(li, q, k, v, plan, kv)
            h = h + F.linear(attn.reshape(-1, nh * hd), layer.o_proj)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            gate, up = F.linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.down_proj)
        assert plan.sample_rows is not None  # the plan is built with them
        h = rms_norm(h.index_select(0, plan.sample_rows), self.norm, cfg.rms_norm_eps)
        return F.linear(h, self.lm_head).float()

    def _attention(self, li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   plan: AttentionPlan, kv: PagedKVCache) -> torch.Tensor:
        """Attention of every packed token; ``[tokens, heads, head_dim]``."""
        cfg = self.cfg
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        group = nh // nkv
        out = torch.empty_like(q)
        for run in plan.decode_runs:
            out[run.start:run.stop] = self._ragged_decode(li, q[run.start:run.stop], run, kv)
        # Decodes, the sdpa way: length-sorted groups padded to their longest, one length-masked
        # SDPA call per group (fused kernels on CUDA). The query heads of one KV head ride in
        # the query-length axis (all of them see the same keys under the same mask), so GQA
        # needs no copy of K and V.
        for g in plan.decode_groups:
            blocks = kv.gather(li, g.table)  # [2, kv_heads, n, max_blocks * block, hd]
            n = g.stop - g.start
            kk = blocks[0].transpose(0, 1)  # [n, kv_heads, ctx, hd]
            vv = blocks[1].transpose(0, 1)
            qq = q[g.start:g.stop].view(n, nkv, group, hd)
            o = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=g.mask)
            out[g.start:g.stop] = o.reshape(n, nh, hd)
        # Prefill chunks: causal attention over the request's earlier KV (from the cache) and the
        # chunk's own tokens, bottom-right aligned. A chunk with no earlier KV attends to the
        # fresh K/V directly. A loop over chunks (few per iteration), not over sequences; each
        # chunk is a handful of kernels on head-major views taken once per layer (on the CPU a
        # kernel call costs about as much as 1000 attention pairs of the tiny shape, so a chunk's
        # fixed cost, which the cost model does not price, is kept small).
        if plan.prefill_chunks:
            q_h, k_h, v_h = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
            out_h = out.transpose(0, 1)  # [heads, tokens, hd] views
        for c in plan.prefill_chunks:
            # 4-D for SDPA: given 3-D inputs the CPU dispatcher takes the math kernel (6x slower
            # at 512 tokens); the chunk's own K/V expanded for GQA (n tokens: cheap; SDPA's
            # enable_gqa is not taken by every CUDA kernel)
            qq = q_h[None, :, c.start:c.stop]  # [1, heads, n, hd]
            kk = k_h[None, :, c.start:c.stop]  # [1, kv_heads, n, hd]
            vv = v_h[None, :, c.start:c.stop]
            if group > 1:
                kk = kk.repeat_interleave(group, dim=1)
                vv = vv.repeat_interleave(group, dim=1)
            if c.table is None:
                o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
            else:
                cached = kv.gather(li, c.table)[:, :, 0]  # [2, kv_heads, blocks * block, hd]
                o = self._continued_chunk(qq, kk, vv, cached, c.context)
            out_h[:, c.start:c.stop] = o[0]
        return out

    def _continued_chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                         cached: torch.Tensor, context: int) -> torch.Tensor:
        """Attention of a chunk that has earlier KV: ``[1, heads, n, hd]``.

        ``q``, ``k``, ``v``: the chunk's own queries, keys and values, ``[1, heads, n, hd]``
        (K/V expanded for GQA); ``cached``: the request's KV from the cache,
        ``[2, kv_heads, >= context, hd]``, whose first ``context - n`` positions are the earlier
        tokens (the rest, the chunk itself, is already written).

        On the CPU, SDPA cannot align a causal mask bottom-right: ``causal_lower_right``
        materialises an ``n x context`` mask and the kernel computes every (query, key) pair, so
        a continued chunk cost about ``n * context`` pairs where the cost model (and a fresh
        chunk's ``is_causal``) prices ``n * start + n * (n + 1) / 2``. Split instead: the chunk
        over the earlier context (no mask, every one of the ``n * start`` pairs counts; the
        query heads of one KV head stacked along the query axis, so no GQA copy of the context)
        and the chunk over itself (``is_causal``: top-left is bottom-right for a square block),
        merged by their log-sum-exps (the weight of the context part is
        ``sigmoid(lse_context - lse_own)``). The CPU flash kernel returns the log-sum-exp; where
        that operator is missing, and on CUDA (whose flash kernels align bottom-right natively),
        one SDPA call with the bottom-right causal mask is used."""
        _, nh, n, hd = q.shape
        nkv = cached.shape[1]
        group = nh // nkv
        start = context - n
        flash = _cpu_flash_with_lse() if q.device.type == "cpu" else None
        if flash is None:
            keys, values = cached[None, 0, :, :context], cached[None, 1, :, :context]
            if group > 1:
                keys = keys.repeat_interleave(group, dim=1)
                values = values.repeat_interleave(group, dim=1)
            return F.scaled_dot_product_attention(q, keys, values,
                                                  attn_mask=causal_lower_right(n, context))
        # [1, kv_heads, group * n, hd]: the group's heads one after another along the query axis
        o_ctx, lse_ctx = flash(q.reshape(1, nkv, group * n, hd), cached[None, 0, :, :start],
                               cached[None, 1, :, :start])
        o_own, lse_own = flash(q, k, v, is_causal=True)
        w_ctx = torch.sigmoid(lse_ctx.reshape(1, nh, n, 1) - lse_own.reshape(1, nh, n, 1))
        return torch.lerp(o_own, o_ctx.reshape(1, nh, n, hd), w_ctx.to(q.dtype))

    def _ragged_decode(self, li: int, q: torch.Tensor, run: RaggedDecodeRun,
                       kv: PagedKVCache) -> torch.Tensor:
        """Attention of one decode query per sequence over that sequence's context, for the
        sequences of a run, without padding any of them to the longest: ``[n, heads, hd]``.

        The run's pages (``page_tokens`` keys each, a sequence's pages back to back) are
        gathered in one call; every page is multiplied by its sequence's query (a batched GEMM
        over pages, ``[group, hd] x [hd, page]`` per KV head), and the softmax and the weighted
        sum are combined per sequence by segment reductions over pages (``scatter_reduce`` of
        the page maxima, ``index_add_`` of the page sums). The work is the summed context plus
        under one page per sequence, in a fixed number of kernels: no loop over sequences.
        Softmax statistics are kept in fp32 (bf16 sums over long contexts lose digits)."""
        cfg = self.cfg
        nh, nkv, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        group = nh // nkv
        n = q.shape[0]
        seq = run.page_seq
        pages, width = seq.shape[0], run.page_tokens
        ctx = kv.gather_blocks(li, run.blocks.parts, run.blocks.max_blocks)  # [2, kv, keys, hd]
        keys = ctx[0].view(nkv, pages, width, hd)
        values = ctx[1].view(nkv, pages, width, hd)
        qq = (q * (1.0 / math.sqrt(hd))).view(n, nkv, group, hd).transpose(0, 1)
        qp = qq.index_select(1, seq)  # [kv, pages, group, hd]: each page's sequence's query
        scores = torch.matmul(qp, keys.transpose(-1, -2)).float() + run.page_mask
        page_max = scores.amax(-1)  # [kv, pages, group]
        seq_max = page_max.new_full((nkv, n, group), -math.inf).scatter_reduce_(
            1, seq.view(1, pages, 1).expand_as(page_max), page_max, "amax")
        weights = (scores - seq_max.index_select(1, seq).unsqueeze(-1)).exp_()
        denom = page_max.new_zeros(nkv, n, group).index_add_(1, seq, weights.sum(-1))
        page_out = torch.matmul(weights.to(values.dtype), values).float()  # [kv, pages, group, hd]
        acc = page_out.new_zeros(nkv, n, group, hd).index_add_(1, seq, page_out)
        return (acc / denom.unsqueeze(-1)).to(q.dtype).transpose(0, 1).reshape(n, nh, hd)

    # ------------------------------------------------------------------ dense reference
    @torch.no_grad()
    def reference_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Logits of every position of one sequence by plain full causal attention, without
        paging, packing or SDPA: the reference the paged path is tested against."""
        cfg = self.cfg
        hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
        n = input_ids.shape[0]
        pos = torch.arange(n, device=input_ids.device)
        cos, sin = self.rope_cos[pos].unsqueeze(1), self.rope_sin[pos].unsqueeze(1)
        causal = torch.ones(n, n, dtype=torch.bool, device=input_ids.device).tril()
        h = F.embedding(input_ids, self.embed)
        for layer in self.typed_layers():
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            q, k, v = F.linear(x, layer.qkv_proj).split((nh * hd, nkv * hd, nkv * hd), dim=-1)
            q, k, v = q.view(n, nh, hd), k.view(n, nkv, hd), v.view(n, nkv, hd)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(nh // nkv, dim=1)
            v = v.repeat_interleave(nh // nkv, dim=1)
            scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) / math.sqrt(hd)
            scores = scores.masked_fill(~causal, float("-inf"))
            attn = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v.float()).to(h.dtype)
            h = h + F.linear(attn.reshape(n, nh * hd), layer.o_proj)
            x = rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            gate, up = F.linear(x, layer.gate_up_proj).chunk(2, dim=-1)
            h = h + F.linear(F.silu(gate) * up, layer.down_proj)
        return F.linear(rms_norm(h, self.norm, cfg.rms_norm_eps), self.lm_head).float()


def _cpu_flash_with_lse():
    """The CPU flash-attention operator that also returns the log-sum-exp of every query row
    (``aten::_scaled_dot_product_flash_attention_for_cpu``, an internal operator of
    ``scaled_dot_product_attention`` since torch 2.2), or None where this torch lacks it."""
    try:
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    except (AttributeError, RuntimeError):
        return None


# ---------------------------------------------------------------------- checkpoints
_HF_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def _hf_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    return files


def load_config(path: str | Path) -> LlamaConfig:
    """The model shape from the ``config.json`` beside a checkpoint (a folder or a file in it)."""
    path = Path(path)
    cfg_path = (path if path.is_dir() else path.parent) / "config.json"
    try:
        hf = json.loads(cfg_path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"no config.json beside the checkpoint: {cfg_path}") from None
    return LlamaConfig.from_hf(hf, name=path.name)


@torch.no_grad()
def load_safetensors(model: LlamaModel, path: str | Path) -> None:
    """Read a Hugging Face Llama checkpoint (one ``.safetensors`` file or a folder of shards)
    into ``model``, converting to its dtype and device.

    Refuses a checkpoint that lacks a tensor the model needs, has one of another shape, or has
    a tensor the model does not know (apart from rotary frequency buffers, which it recomputes).
    """
    from safetensors import safe_open

    cfg = model.cfg
    hd, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    path = Path(path)
    tensors: dict[str, tuple[Path, Any]] = {}
    handles = []
    for f in _hf_files(path):
        h = safe_open(str(f), framework="pt", device="cpu")
        handles.append(h)
        for name in h.keys():
            tensors[name] = (f, h)

    used: set[str] = set()

    def get(name: str, shape: tuple[int, ...]) -> torch.Tensor:
        if name not in tensors:
            raise KeyError(f"{path}: checkpoint has no tensor {name!r}")
        t = tensors[name][1].get_tensor(name)
        if tuple(t.shape) != shape:
            raise ValueError(f"{path}: tensor {name!r} has shape {tuple(t.shape)}, the model "
                             f"({cfg.name}) needs {shape}")
        used.add(name)
        return t

    def put(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src.to(device=dst.device, dtype=dst.dtype))

    h_, i_ = cfg.hidden_size, cfg.intermediate_size
    put(model.embed, get("model.embed_tokens.weight", (cfg.vocab_size, h_)))
    for i, layer in enumerate(model.typed_layers()):
        pre = f"model.layers.{i}."
        put(layer.input_norm, get(pre + "input_layernorm.weight", (h_,)))
        put(layer.post_norm, get(pre + "post_attention_layernorm.weight", (h_,)))
        put(layer.qkv_proj, torch.cat([get(pre + "self_attn.q_proj.weight", (nh * hd, h_)),
                                       get(pre + "self_attn.k_proj.weight", (nkv * hd, h_)),
                                       get(pre + "self_attn.v_proj.weight", (nkv * hd, h_))]))
        put(layer.o_proj, get(pre + "self_attn.o_proj.weight", (h_, nh * hd)))
        put(layer.gate_up_proj, torch.cat([get(pre + "mlp.gate_proj.weight", (i_, h_)),
                                           get(pre + "mlp.up_proj.weight", (i_, h_))]))
        put(layer.down_proj, get(pre + "mlp.down_proj.weight", (h_, i_)))
    put(model.norm, get("model.norm.weight", (h_,)))
    if not cfg.tie_word_embeddings:
        put(model.lm_head, get("lm_head.weight", (cfg.vocab_size, h_)))
    unknown = sorted(n for n in tensors if n not in used and not n.endswith(_HF_IGNORED_SUFFIXES)
                     and not (cfg.tie_word_embeddings and n == "lm_head.weight"))
    if unknown:
        raise ValueError(f"{path}: {len(unknown)} tensor(s) the model ({cfg.name}) does not "
                         f"use, e.g. {unknown[:3]}")
