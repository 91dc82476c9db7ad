"""The torch executor: a real Llama-architecture decoder over a paged KV cache.

Every engine iteration is one packed forward pass: the decode tokens (one per running request)
and the prefill chunks go through every GEMM together; attention reads each request's KV through
its block table (``Request.block_ids``). Decodes are attended without a loop over sequences: on
the CPU (``decode_attention="ragged"``) as pages of every sequence's own context, so the work
follows the summed context the cost model prices (a padded batch would cost sequences x the
longest context); on CUDA (``"sdpa"``) in a few length-sorted groups padded to their longest, one
fused SDPA call each. Prefill chunks, a few per iteration, take one call each (two for a chunk
with earlier context on the CPU, so that it costs its attention pairs; see
:meth:`LlamaModel._continued_chunk`). The plan is built with numpy over the concatenated block
tables, so the host work per iteration is a constant plus a little per request and per block.

Memory. The executor plans with a :class:`MemoryModel` like the simulator's: a budget (40 GiB for
the default shape on an H200; a few hundred MiB for the CPU tiny shape), the real weight bytes,
the KV bytes per token of the model, and an activation workspace. ``resize_kv`` really allocates
and frees the KV slabs (:class:`runtime.engine.torch_kv.PagedKVCache`), so ``kv_cache_ratio``
changes the memory the process holds. An iteration whose activations the memory model says do
not fit in the workspace is refused as an OOM before it runs (on the CPU, where nothing else would
enforce the budget, this is the only OOM; on CUDA the allocator is also capped at the budget, and a
real ``torch.OutOfMemoryError`` is caught and reported the same way).

Activation estimate (``act_bytes_per_token``, ``act_fixed_bytes``) when not given: per token, the
tensors alive at the widest point of a layer (residual, normed input, fused QKV, rotated q/k,
attention output, fused gate/up, SiLU and product) in the model dtype plus fp32 norm statistics,
with 25% allocator slack; fixed, the fp32 logits of ``max_num_seqs`` sampled rows, two copies of
one decode run's or group's gathered KV (the gather and, for sdpa, the kernel's contiguous copy;
for ragged, the fp32 scores and page outputs, far smaller), and one prefill chunk's gathered
context at ``max_position`` (with the GQA head expansion). On CUDA the per-token slope is
measured instead from the allocator's peak over two prefill sizes (``measure_activations``).
The CPU's SDPA materialises prefill attention scores (quadratic in the chunk); that is not
modelled, since the CPU budget is a test fixture, not a physical limit.

Not done, and why: no CUDA graphs and no fused paged-attention kernel (the decode path gathers
the blocks it reads into a temporary, then multiplies), so a decode step pays eager kernel
launches and reads the KV about twice; the profile measures what this executor does.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import operator
import time
from typing import TYPE_CHECKING

import numpy as np
import torch

from runtime.engine.executor import Batch, DecodeCost, IterationResult, MemoryModel
from runtime.engine.torch_kv import (
    AttentionPlan,
    DecodeGroup,
    GatherTable,
    PagedKVCache,
    PrefillChunk,
    RaggedDecodeRun,
)
from runtime.engine.torch_model import LlamaConfig, LlamaModel, load_safetensors, token_ids

if TYPE_CHECKING:
    from runtime.engine.request import Request

MIB = 1024 ** 2
MAX_SLABS = 8
"""the pool at the highest ratio is cut into at most this many slabs: a gather touches few,
and a resize reallocates at most one slab's worth"""


TINY_BUDGET_GIB = 0.25
"""the memory budget of the CPU test shape ``tiny``"""
SCALED_DOWN_BUDGET_GIB = 1.0
"""the memory budget of the scaled-down ``-cpu`` shapes: a prefill's attention workspace grows
with the query heads per KV head (8 for the 70B shapes), and ratio 0.95 leaves it 5%"""
FULL_BUDGET_GIB = 40.0
"""the memory budget of the full-size shapes: DESIGN.md's H200 setting"""


def default_budget_gib(shape: str) -> float:
    """The memory budget a named shape gets unless one is given."""
    from runtime.engine.torch_model import CPU_SUFFIX

    if shape == "tiny":
        return TINY_BUDGET_GIB
    return SCALED_DOWN_BUDGET_GIB if shape.endswith(CPU_SUFFIX) else FULL_BUDGET_GIB


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class TorchExecutor:
    """:param model_config: the model shape
    :param budget_bytes: the memory the engine may plan with (weights, KV and activations)
    :param device: ``cuda`` or ``cpu`` (default: CUDA when present)
    :param dtype: default bf16 on CUDA, fp32 on the CPU
    :param block_size: tokens per KV block (the engine's block size)
    :param seed: seed of the random weights
    :param checkpoint: a Hugging Face Llama safetensors file or folder to load instead
    :param slab_blocks: KV blocks per slab (default: the pool at ratio 0.95 in ``MAX_SLABS``)
    :param decode_gather_bytes: the most KV bytes (per layer) one decode run (ragged) or group
        (sdpa) gathers (default: 1% of the memory after weights, clamped to 64 KiB .. 256 MiB)
    :param decode_page_tokens: keys per page of the ragged decode attention, a multiple of
        ``block_size`` (default: 64 tokens, at least one block). Larger pages make fewer,
        larger GEMMs; each sequence pads its last page, under one page of extra work.
    :param max_num_seqs: the most sequences sampled in one iteration (sizes the logits workspace)
    :param act_fixed_bytes: override the fixed activation workspace estimate
    :param act_bytes_per_token: override the per-token activation estimate
    :param measure_activations: measure the per-token activation bytes on CUDA (default on CUDA)
    :param cap_process_memory: cap the CUDA allocator at the budget (plus one slab, the
        transient of a resize), so the budget is real (default on CUDA)
    :param keep_logits: keep the last logits of every request (for tests; costs a host copy)
    :param decode_attention: ``"ragged"`` or ``"sdpa"`` (default: sdpa on CUDA, ragged on the
        CPU; see :class:`LlamaModel`)
    :param timer: ``"wall"`` (default; with a device synchronisation on CUDA) or ``"thread"``:
        the CPU time of the calling thread, on the CPU with one torch thread only. On a shared
        machine the wall clock also measures the neighbours (a busy 2-core host stretched
        identical iterations 2x); the thread's CPU time is what the iteration itself costs, as
        a dedicated core would see it. Not for wall-clock serving.
    """

    def __init__(self, model_config: LlamaConfig, *, budget_bytes: int,
                 device: str | torch.device | None = None, dtype: torch.dtype | None = None,
                 block_size: int = 16, seed: int = 0, checkpoint: str | None = None,
                 slab_blocks: int | None = None, decode_gather_bytes: int | None = None,
                 max_num_seqs: int = 256, act_fixed_bytes: int | None = None,
                 act_bytes_per_token: int | None = None, measure_activations: bool | None = None,
                 cap_process_memory: bool | None = None, keep_logits: bool = False,
                 decode_attention: str | None = None, decode_page_tokens: int | None = None,
                 timer: str = "wall") -> None:
        self.device = torch.device(device) if device is not None else default_device()
        if timer not in ("wall", "thread"):
            raise ValueError(f"timer must be 'wall' or 'thread', got {timer!r}")
        if timer == "thread" and (self.device.type != "cpu" or torch.get_num_threads() != 1):
            raise ValueError("timer='thread' measures the calling thread: it needs the CPU with "
                             f"one torch thread (device {self.device}, "
                             f"{torch.get_num_threads()} threads)")
        self.timer = timer
        self._clock = time.thread_time if timer == "thread" else time.perf_counter
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("device='cuda' was asked for, but torch sees no CUDA device "
                               f"(torch {torch.__version__})")
        on_cuda = self.device.type == "cuda"
        self.dtype = dtype if dtype is not None else (torch.bfloat16 if on_cuda else torch.float32)
        self.cfg = model_config
        self.max_model_len = model_config.max_position
        self.block_size = block_size
        self.keep_logits = keep_logits
        self.max_num_seqs = max_num_seqs
        self.model = LlamaModel(model_config, self.device, self.dtype, seed=seed,
                                decode_attention=decode_attention)
        if checkpoint is not None:
            load_safetensors(self.model, checkpoint)
        self.checkpoint = checkpoint
        e = torch.empty(0, dtype=self.dtype).element_size()
        self.dtype_bytes = e
        # Weights and the rotary tables: everything that is neither KV nor per-iteration.
        weight_bytes = self.model.weight_bytes + sum(
            b.numel() * b.element_size() for b in self.model.buffers())
        if budget_bytes <= weight_bytes:
            raise ValueError(f"budget_bytes={budget_bytes} does not exceed the weights "
                             f"({weight_bytes} bytes, {model_config.name})")
        free = budget_bytes - weight_bytes
        kv_per_token = model_config.kv_bytes_per_token(e)
        kv_layer_block = kv_per_token // model_config.num_layers * block_size
        self.decode_gather_bytes = (decode_gather_bytes if decode_gather_bytes is not None else
                                    int(min(256 * MIB, max(64 * 1024, 0.01 * free))))
        # (1% of the memory after weights keeps two gathers well inside the 5% workspace the
        # highest ratio leaves)
        if self.decode_gather_bytes < kv_layer_block:
            raise ValueError(f"decode_gather_bytes={self.decode_gather_bytes} cannot hold one "
                             f"block of one layer ({kv_layer_block} bytes)")
        if decode_page_tokens is None:
            decode_page_tokens = block_size * max(1, 64 // block_size)
        if decode_page_tokens < block_size or decode_page_tokens % block_size:
            raise ValueError(f"decode_page_tokens={decode_page_tokens} is not a positive "
                             f"multiple of block_size={block_size}")
        self.decode_page_tokens = decode_page_tokens
        est_fixed, est_token = self._estimate_activations()
        self.activation_source = "estimate"
        if measure_activations if measure_activations is not None else on_cuda:
            est_token = self._measure_activation_slope(est_token)
        self.memory = MemoryModel(
            total_bytes=int(budget_bytes), weight_bytes=int(weight_bytes),
            kv_bytes_per_token=kv_per_token, block_size=block_size,
            act_fixed_bytes=int(act_fixed_bytes if act_fixed_bytes is not None else est_fixed),
            act_bytes_per_token=int(act_bytes_per_token if act_bytes_per_token is not None
                                    else est_token))
        if slab_blocks is None:
            slab_blocks = max(1, math.ceil(self.memory.num_kv_blocks(0.95) / MAX_SLABS))
        self.kv = PagedKVCache(model_config.num_layers, model_config.num_kv_heads,
                               model_config.head_dim, block_size, slab_blocks, self.device,
                               self.dtype)
        if on_cuda and (cap_process_memory if cap_process_memory is not None else True):
            # The cap leaves room for one slab more than the budget: growing or cutting the last
            # slab holds its old and new copies for a moment (and 256 MiB for CUDA's workspaces).
            total = torch.cuda.get_device_properties(self.device).total_memory
            cap = budget_bytes + slab_blocks * self.memory.kv_block_bytes + 256 * MIB
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), self.device)
        self.last_logits: dict[int, torch.Tensor] = {}
        self.num_real_ooms = 0
        self.num_budget_ooms = 0

    @classmethod
    def for_shape(cls, shape: str, device: str | None = None, budget_gib: float | None = None,
                  max_model_len: int | None = None, **kw) -> TorchExecutor:
        """An executor for a named shape (``tiny``, a catalogue model such as ``llama3.1-8b``, or
        its scaled-down ``llama3.1-8b-cpu``) with its default budget (:func:`default_budget_gib`);
        ``max_model_len`` shortens the shape's context (its fixed attention workspace gathers
        one layer's keys and values for a whole context: 2.7 GB for Llama-3.1-8B at 128k, more
        than the 5% that ratio 0.95 leaves of a 40 GiB budget). Other keywords go to the
        constructor. One device: a model larger than one accelerator is not split (the roofline
        prices tensor parallel)."""
        from runtime.engine.torch_model import SHAPES
        if shape not in SHAPES:
            raise ValueError(f"unknown shape {shape!r} (known: {sorted(SHAPES)})")
        gib = budget_gib if budget_gib is not None else default_budget_gib(shape)
        cfg = SHAPES[shape]
        if max_model_len is not None:
            cfg = dataclasses.replace(cfg, max_position=max_model_len)
        return cls(cfg, budget_bytes=int(gib * 1024 ** 3), device=device, **kw)

    # ------------------------------------------------------------------ memory
    def _estimate_activations(self) -> tuple[int, int]:
        c, e = self.cfg, self.dtype_bytes
        qkv = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        per_token = e * (4 * c.hidden_size + 2 * qkv + 4 * c.intermediate_size
                         + 2 * c.head_dim) + 8 * c.hidden_size
        per_token = int(1.25 * per_token)
        kv_layer_token = c.kv_bytes_per_token(e) // c.num_layers
        group = c.num_heads // c.num_kv_heads
        fixed = (self.max_num_seqs * c.vocab_size * (e + 4)
                 + 2 * self.decode_gather_bytes
                 + c.max_position * kv_layer_token * (1 + (group if group > 1 else 0)))
        return int(fixed), per_token

    def _measure_activation_slope(self, fallback: int) -> int:
        """Peak allocator bytes of prefill forwards at two sizes, on a scratch KV pool; the slope
        (with 20% slack) is the per-token activation size. Falls back to the estimate on any
        failure and says so in ``activation_source``."""
        if self.device.type != "cuda":
            return fallback
        sizes = (256, 1024)
        try:
            kv = PagedKVCache(self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim,
                              self.block_size, 1 << 30, self.device, self.dtype)
            kv.resize(-(-sizes[-1] // self.block_size), {})
            peaks = []
            for n in sizes:
                plan, ids, pos = self._plan_prefill_only(kv, n)
                torch.cuda.synchronize(self.device)
                base = torch.cuda.memory_allocated(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
                self.model(ids, pos, plan, kv)
                torch.cuda.synchronize(self.device)
                peaks.append(torch.cuda.max_memory_allocated(self.device) - base)
            del kv
            torch.cuda.empty_cache()
            slope = (peaks[1] - peaks[0]) / (sizes[1] - sizes[0])
            if slope <= 0:
                raise ValueError(f"non-positive activation slope {slope} from peaks {peaks}")
            self.activation_source = f"measured on CUDA: peaks {peaks} bytes at {sizes} tokens"
            return int(1.2 * slope)
        except Exception as exc:  # a measurement aid: never fatal
            self.activation_source = f"estimate (measurement failed: {exc!r})"
            return fallback

    def _plan_prefill_only(self, kv: PagedKVCache,
                           n: int) -> tuple[AttentionPlan, torch.Tensor, torch.Tensor]:
        """A plan of one fresh ``n``-token prefill in blocks 0, 1, ... of ``kv``."""
        pos = np.arange(n, dtype=np.int64)
        slots = pos  # blocks 0, 1, ... in order: slot == position
        plan = AttentionPlan(num_decodes=0, writes=kv.split_slots(slots))
        plan.prefill_chunks.append(PrefillChunk(0, n, n, None))
        plan.sample_rows = torch.tensor([n - 1], device=self.device)
        pos_t = torch.from_numpy(pos).to(self.device)
        ids = token_ids(torch.zeros_like(pos_t), pos_t, self.cfg.vocab_size)
        return plan, ids, pos_t

    @property
    def bytes_held(self) -> int:
        """KV bytes really allocated now."""
        return self.kv.bytes_held

    # ------------------------------------------------------------------ the protocol
    def decode_cost(self) -> DecodeCost | None:
        return None  # measured, not promised: the engine steps one iteration at a time

    def resize_kv(self, num_blocks: int, moves: dict[int, int]) -> float:
        t0 = self._clock()
        self.kv.resize(num_blocks, moves)
        self._sync()
        return self._clock() - t0

    def execute(self, batch: Batch, kv_cache_ratio: float) -> IterationResult:
        t0 = self._clock()
        if not self.memory.fits(batch.num_tokens, kv_cache_ratio):
            self.num_budget_ooms += 1
            return IterationResult(self._clock() - t0, oom=True)
        try:
            plan, ids, pos, rows = self._plan(batch)
            logits = self.model(ids, pos, plan, self.kv)
            # Greedy sampling and the copy to the host, as a serving engine does; the copy
            # also waits for the device.
            sampled = logits.argmax(-1).cpu()
            del sampled
        except torch.OutOfMemoryError:
            return self._oom(t0)
        except RuntimeError as exc:  # the CPU allocator raises a plain RuntimeError
            if "can't allocate memory" not in str(exc):
                raise
            return self._oom(t0)
        if self.keep_logits:
            cpu = logits.cpu()
            for i, r in enumerate(rows):
                self.last_logits[r.req_id] = cpu[i]
        return IterationResult(self._clock() - t0)

    def _oom(self, t0: float) -> IterationResult:
        self.num_real_ooms += 1
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return IterationResult(self._clock() - t0, oom=True)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------------ planning
    def _plan(self, batch: Batch) -> tuple[AttentionPlan, torch.Tensor, torch.Tensor,
                                           list[Request]]:
        """Pack a batch: decodes first (in batch order for the ragged attention; longest
        context first for the sdpa groups), then the prefill chunks. Returns the plan, token
        ids, positions and the request of every sampled row.

        Vectorised over requests: each request's block table is read once (its list is
        concatenated into one array), and the token ids, positions, write slots and gather
        tables are numpy operations over the concatenation, so the host work per iteration is a
        constant plus a small amount per request and per block. Only the prefill chunks (a few
        per iteration) get one Python step each."""
        plan = AttentionPlan(num_decodes=len(batch.decodes), writes=[])
        decodes, req_d, pos_d, slot_d = self._plan_decodes(batch.decodes, plan)
        preqs, req_p, pos_p, slot_p, last_p = self._plan_prefills(batch.prefills, plan)
        slots = np.concatenate((slot_d, slot_p))
        if len(slots):
            plan.writes = self.kv.split_slots(slots)
        dev = self.device
        sample = np.concatenate((np.arange(len(decodes), dtype=np.int64), last_p))
        plan.sample_rows = torch.from_numpy(sample).to(dev)
        pos_t = torch.from_numpy(np.concatenate((pos_d, pos_p))).to(dev)
        req_t = torch.from_numpy(np.concatenate((req_d, req_p))).to(dev)
        return plan, token_ids(req_t, pos_t, self.cfg.vocab_size), pos_t, decodes + preqs

    def _plan_decodes(self, decodes: list[Request], plan: AttentionPlan
                      ) -> tuple[list[Request], np.ndarray, np.ndarray, np.ndarray]:
        """The decode rows: their requests in row order, and per row the request id, the
        position and the KV slot of the new token; fills the plan's runs (or groups)."""
        nd = len(decodes)
        if not nd:  # (common: skip the fixed cost of the numpy calls below)
            return [], _NONE, _NONE, _NONE
        bs = self.block_size
        ctx = np.fromiter(map(_COMPUTED, decodes), dtype=np.int64, count=nd) + 1
        if self.model.decode_attention == "sdpa" and nd > 1:
            order = np.argsort(-ctx, kind="stable")
            ctx = ctx[order]
            decodes = [decodes[i] for i in order]
        else:
            decodes = list(decodes)
        tables, offsets, lens = _concat_tables(decodes)
        _check_positions(decodes, ctx, self.cfg.max_position)
        need = -(-ctx // bs)
        _check_tables(decodes, need, lens, ctx - 1, "decode at position")
        pos = ctx - 1
        slots = tables[offsets + pos // bs] * bs + pos % bs
        if self.model.decode_attention == "ragged":
            plan.decode_runs = self._ragged_runs(tables, offsets, need, ctx)
        else:
            plan.decode_groups = self._sdpa_groups(tables, offsets, need, ctx)
        req = np.fromiter(map(_REQ_ID, decodes), dtype=np.int64, count=nd)
        return decodes, req, pos, slots

    def _plan_prefills(self, prefills: list[tuple[Request, int]], plan: AttentionPlan
                       ) -> tuple[list[Request], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The prefill rows, after the plan's decode rows: the chunks' requests, and per row
        the request id, the position and the KV slot, and each chunk's last row (sampled);
        fills the plan's chunks."""
        npf = len(prefills)
        if not npf:
            return [], _NONE, _NONE, _NONE, _NONE
        bs = self.block_size
        preqs = [r for r, _ in prefills]
        start = np.fromiter(map(_COMPUTED, preqs), dtype=np.int64, count=npf)
        cnt = np.fromiter((n for _, n in prefills), dtype=np.int64, count=npf)
        end = start + cnt
        tables, offsets, lens = _concat_tables(preqs)
        _check_positions(preqs, end, self.cfg.max_position)
        need = -(-end // bs)
        _check_tables(preqs, need, lens, end - 1, "a prefill to position")
        first = plan.num_decodes + np.cumsum(cnt) - cnt  # each chunk's first row
        seg = np.repeat(np.arange(npf), cnt)
        pos = start[seg] + np.arange(len(seg)) + plan.num_decodes - first[seg]
        slots = tables[offsets[seg] + pos // bs] * bs + pos % bs
        for s0, row, n, e, o, k in zip(start.tolist(), first.tolist(), cnt.tolist(),
                                       end.tolist(), offsets.tolist(), need.tolist()):
            table = None if s0 == 0 else self.kv.table(tables[o:o + k][None, :])
            plan.prefill_chunks.append(PrefillChunk(row, row + n, e, table))
        req = np.fromiter(map(_REQ_ID, preqs), dtype=np.int64, count=npf)
        return preqs, np.repeat(req, cnt), pos, slots, first + cnt - 1

    @property
    def _layer_block_bytes(self) -> int:
        """KV bytes of one block of one layer (the unit of a gather)."""
        per_token = self.cfg.kv_bytes_per_token(self.dtype_bytes) // self.cfg.num_layers
        return per_token * self.block_size

    def _ragged_runs(self, tables: np.ndarray, offsets: np.ndarray, need: np.ndarray,
                     ctx: np.ndarray) -> list[RaggedDecodeRun]:
        """Cut the decodes into consecutive runs whose pages' blocks stay under
        ``decode_gather_bytes`` per layer (a sequence longer than that is a run of its own),
        and lay out every run's pages (see :class:`RaggedDecodeRun`). A loop over runs, whose
        number grows with the summed context, not with the sequences."""
        bs, width = self.block_size, self.decode_page_tokens
        per_page = width // bs
        pages = -(-ctx // width)
        pblocks = pages * per_page
        cap = max(per_page, self.decode_gather_bytes // self._layer_block_bytes)
        cum = np.cumsum(pblocks)
        runs = []
        j, nd = 0, len(ctx)
        while j < nd:
            base = int(cum[j - 1]) if j else 0
            stop = max(j + 1, int(np.searchsorted(cum, base + cap, side="right")))
            sl = slice(j, stop)
            n, pb, pg = stop - j, pblocks[sl], pages[sl]
            seq_of_block = np.repeat(np.arange(n), pb)
            within = np.arange(int(pb.sum())) - (np.cumsum(pb) - pb)[seq_of_block]
            # past the context: the sequence's last block again (a valid id, usually in the same
            # slab, so the gather stays one call), masked out below
            ids = tables[offsets[sl][seq_of_block]
                         + np.minimum(within, need[sl][seq_of_block] - 1)]
            mask = np.zeros((int(pg.sum()), width), dtype=np.float32)
            valid = ctx[sl] - (pg - 1) * width  # context tokens in each last page: 1 .. width
            mask[np.cumsum(pg) - 1] = np.where(np.arange(width)[None, :] < valid[:, None],
                                               0.0, -np.inf)
            runs.append(RaggedDecodeRun(
                j, stop, GatherTable(1, len(ids), self.kv.split_blocks(ids)), width,
                torch.from_numpy(np.repeat(np.arange(n), pg)).to(self.device),
                torch.from_numpy(mask).to(self.device).unsqueeze(1)))
            j = stop
        return runs

    def _sdpa_groups(self, tables: np.ndarray, offsets: np.ndarray, need: np.ndarray,
                     ctx: np.ndarray) -> list[DecodeGroup]:
        """Length-sorted decode groups (``ctx`` descending) whose padded gather stays under
        ``decode_gather_bytes`` per layer."""
        bs, dev = self.block_size, self.device
        cap = max(1, self.decode_gather_bytes // self._layer_block_bytes)
        groups = []
        j, nd = 0, len(ctx)
        while j < nd:
            width = int(need[j])  # the longest in the group: sorted descending
            n = max(1, min(nd - j, cap // width))
            sl = slice(j, j + n)
            # padding: the row's last real block again (a valid id), masked out below
            idx = offsets[sl, None] + np.minimum(np.arange(width)[None, :], need[sl, None] - 1)
            lens = torch.from_numpy(ctx[sl]).to(dev)
            mask = torch.arange(width * bs, device=dev)[None, :] < lens[:, None]
            groups.append(DecodeGroup(j, j + n, self.kv.table(tables[idx]),
                                      mask[:, None, None, :]))
            j += n
        return groups


_NONE = np.empty(0, dtype=np.int64)
_COMPUTED = operator.attrgetter("num_computed_tokens")
_REQ_ID = operator.attrgetter("req_id")
_BLOCK_IDS = operator.attrgetter("block_ids")


def _concat_tables(reqs: list[Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The requests' block tables back to back, each one's offset into that array, and their
    lengths (one pass over the lists, in C)."""
    lists = list(map(_BLOCK_IDS, reqs))
    lens = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64,
                       count=int(lens.sum()))
    return flat, np.cumsum(lens) - lens, lens


def _check_tables(reqs: list[Request], need: np.ndarray, have: np.ndarray,
                  last_pos: np.ndarray, what: str) -> None:
    """Refuse a batch whose block tables are shorter than their tokens need, naming the first
    such request."""
    short = need > have
    if short.any():
        j = int(np.argmax(short))
        raise ValueError(f"request {reqs[j].req_id}: {what} {int(last_pos[j])} needs "
                         f"{int(need[j])} blocks, its block table has {int(have[j])}")


def _check_positions(reqs: list[Request], context: np.ndarray, max_position: int) -> None:
    """Refuse a batch with a token beyond the model's positions (the rotary table's length),
    naming the first such request."""
    over = context > max_position
    if over.any():
        j = int(np.argmax(over))
        raise ValueError(f"request {reqs[j].req_id}: position {int(context[j]) - 1} is beyond "
                         f"the model's max_position={max_position}")
