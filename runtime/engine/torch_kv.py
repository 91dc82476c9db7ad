"""The torch executor's paged KV cache, held in slabs that can be freed, and the per-iteration
attention plan that tells the model where every token's K/V goes and what each attention reads.

Layout. Block ``b`` lives in slab ``b // slab_blocks`` at index ``b % slab_blocks``. Every slab is
``[layers, 2, kv_heads, blocks, block_size, head_dim]`` (K and V, then heads, outermost): a gather
of blocks for one layer is one ``index_select`` over the block axis of a
``[2 * kv_heads, blocks, block_size * head_dim]`` view, and what it returns is, per K/V and head,
the gathered tokens as one contiguous ``[tokens, head_dim]`` matrix. That is the layout attention
multiplies by (SDPA's ``[heads, keys, head_dim]``; the ragged decode's pages of keys), so neither
path copies K or V again after the gather (with tokens outermost, the transposing copy before
the matmul cost about three times the matmul on the CPU). The layout is vLLM's (per block:
heads, then tokens), with K and V in one tensor.

All slabs but the last hold ``slab_blocks`` blocks; the last holds exactly the remainder, so the
bytes held are exactly ``num_blocks * block bytes``: resizing drops or adds whole slabs and
reallocates at most the last one, so a resize never needs more than one slab of extra memory
(one contiguous pool would need old + new at once).

The engine's block pool hands out the lowest free ids first, so the blocks in use crowd the low
slabs and a gather usually touches one or two of them.

Plans are built on the CPU with numpy (block tables are Python lists in the engine) and copied
to the device once per iteration; the model then runs without host round trips.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass(slots=True)
class SlabIndex:
    """The part of a gather or a write that falls in one slab."""

    slab: int
    local: torch.Tensor
    """block (gather) or token-slot (write) indices inside the slab"""
    rows: torch.Tensor | None
    """where those entries go in (gather) or come from (write); None when it is all of them,
    in order"""


@dataclass(slots=True)
class GatherTable:
    """A padded block table ``[rows, max_blocks]`` split by slab."""

    rows: int
    max_blocks: int
    parts: list[SlabIndex]


@dataclass(slots=True)
class DecodeGroup:
    """Consecutive decode rows ``start .. stop-1`` attended in one padded SDPA call (the
    ``sdpa`` decode attention)."""

    start: int
    stop: int
    table: GatherTable
    mask: torch.Tensor
    """``[rows, 1, 1, max_blocks * block_size]`` True where a key position is within context"""


@dataclass(slots=True)
class RaggedDecodeRun:
    """Consecutive decode rows ``start .. stop-1`` attended together without padding to the
    longest (the ``ragged`` decode attention).

    Every sequence's context is cut into pages of ``page_tokens`` keys (whole blocks); the last
    page of a sequence is filled up with copies of its last block, masked out. The pages of all
    sequences lie back to back, so the work is the summed context plus less than a page per
    sequence, and no sequence is padded to another's length."""

    start: int
    stop: int
    blocks: GatherTable
    """the pages' blocks in order, as one row"""
    page_tokens: int
    page_seq: torch.Tensor
    """``[pages]`` the run-local sequence (0 .. stop-start-1) of every page"""
    page_mask: torch.Tensor
    """``[pages, 1, page_tokens]`` additive: 0 within context, -inf past it"""


@dataclass(slots=True)
class PrefillChunk:
    """Packed rows ``start .. stop-1`` of one request's chunk, at positions
    ``context - (stop - start) .. context - 1``."""

    start: int
    stop: int
    context: int
    table: GatherTable | None
    """the request's blocks, or None when the chunk has no earlier KV (attends to itself)"""


@dataclass(slots=True)
class AttentionPlan:
    num_decodes: int
    writes: list[SlabIndex]
    decode_groups: list[DecodeGroup] = field(default_factory=list)
    decode_runs: list[RaggedDecodeRun] = field(default_factory=list)
    prefill_chunks: list[PrefillChunk] = field(default_factory=list)
    sample_rows: torch.Tensor | None = None


class PagedKVCache:
    """:param num_layers: decoder layers
    :param num_kv_heads: KV heads per layer
    :param head_dim: width of one head
    :param block_size: tokens per block
    :param slab_blocks: blocks per slab (the unit of allocation and release)
    :param device: where the slabs live
    :param dtype: the KV dtype
    """

    BLOCK_AXIS = 3
    """the block axis of a slab ``[layers, 2, kv_heads, blocks, block_size, head_dim]``"""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, block_size: int,
                 slab_blocks: int, device: torch.device, dtype: torch.dtype) -> None:
        if slab_blocks < 1:
            raise ValueError(f"slab_blocks must be >= 1, got {slab_blocks}")
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.block_size = block_size
        self.slab_blocks = slab_blocks
        self.device = device
        self.dtype = dtype
        self.slabs: list[torch.Tensor] = []
        self.num_blocks = 0

    @property
    def block_bytes(self) -> int:
        """Bytes of one block over all layers."""
        return (self.num_layers * self.block_size * 2 * self.num_kv_heads * self.head_dim
                * torch.empty(0, dtype=self.dtype).element_size())

    @property
    def bytes_held(self) -> int:
        """Bytes of the slabs now allocated (what the cache really holds)."""
        return sum(s.numel() * s.element_size() for s in self.slabs)

    def _new_slab(self, blocks: int) -> torch.Tensor:
        # Zero-filled: padding entries of a gather read real (possibly never written) slots and
        # are masked out; masked keys get weight 0, and 0 * garbage would be NaN if garbage
        # were NaN, so unwritten memory must hold finite values.
        return torch.zeros(self.num_layers, 2, self.num_kv_heads, blocks, self.block_size,
                           self.head_dim, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ resize
    @torch.no_grad()
    def resize(self, num_blocks: int, moves: dict[int, int]) -> None:
        """Copy block ``src`` to ``dst`` for every move, then hold exactly ``num_blocks``."""
        if num_blocks < 1:
            raise ValueError(f"a KV cache needs at least 1 block, got {num_blocks}")
        B = self.slab_blocks
        ax = self.BLOCK_AXIS
        for src, dst in moves.items():
            if not (0 <= src < self.num_blocks and 0 <= dst < num_blocks):
                raise ValueError(f"block move {src} -> {dst} is out of range (held "
                                 f"{self.num_blocks}, resizing to {num_blocks})")
        if moves:
            by_pair: dict[tuple[int, int], tuple[list[int], list[int]]] = {}
            for src, dst in moves.items():
                s, d = by_pair.setdefault((src // B, dst // B), ([], []))
                s.append(src % B)
                d.append(dst % B)
            for (ss, ds), (s, d) in by_pair.items():
                si = torch.tensor(s, device=self.device)
                di = torch.tensor(d, device=self.device)
                self.slabs[ds].index_copy_(ax, di, self.slabs[ss].index_select(ax, si))
        sizes = [B] * (num_blocks // B) + ([num_blocks % B] if num_blocks % B else [])
        freed = False
        while len(self.slabs) > len(sizes):  # release whole slabs first, to keep the peak low
            self.slabs.pop()
            freed = True
        for i, size in enumerate(sizes):
            if i < len(self.slabs):
                old = self.slabs[i]
                if old.shape[ax] != size:  # the last slab: reallocate to the exact size
                    new = self._new_slab(size)
                    keep = min(size, old.shape[ax])
                    new.narrow(ax, 0, keep).copy_(old.narrow(ax, 0, keep))
                    self.slabs[i] = new
                    del old
                    freed = True
            else:
                self.slabs.append(self._new_slab(size))
        self.num_blocks = num_blocks
        if freed and self.device.type == "cuda":
            # Hand the freed slabs back to the driver: the budget is memory others may use.
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()

    # ------------------------------------------------------------------ plans
    def split_blocks(self, ids: np.ndarray) -> list[SlabIndex]:
        """Split flat block ids into per-slab parts (gather indices)."""
        return self._split(ids, self.slab_blocks)

    def split_slots(self, slots: np.ndarray) -> list[SlabIndex]:
        """Split flat token slots (``block * block_size + offset``) into per-slab parts."""
        return self._split(slots, self.slab_blocks * self.block_size)

    def _split(self, flat: np.ndarray, per_slab: int) -> list[SlabIndex]:
        slab = flat // per_slab
        local = flat - slab * per_slab
        dev = self.device
        lo, hi = int(slab.min()), int(slab.max())
        if lo == hi:
            return [SlabIndex(lo, torch.from_numpy(local).to(dev), None)]
        parts = []
        for s in np.unique(slab):
            rows = np.flatnonzero(slab == s)
            parts.append(SlabIndex(int(s), torch.from_numpy(local[rows]).to(dev),
                                   torch.from_numpy(rows).to(dev)))
        return parts

    def table(self, ids: np.ndarray) -> GatherTable:
        """A gather table from a padded ``[rows, max_blocks]`` array of block ids."""
        rows, max_blocks = ids.shape
        return GatherTable(rows, max_blocks, self.split_blocks(ids.reshape(-1)))

    # ------------------------------------------------------------------ model access
    def _layer_tokens(self, slab: int, layer: int) -> torch.Tensor:
        """A slab's layer as ``[2, kv_heads, slots, head_dim]`` (slot = block * size + offset)."""
        return self.slabs[slab][layer].view(2, self.num_kv_heads, -1, self.head_dim)

    def write(self, layer: int, plan: AttentionPlan, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the packed tokens' K and V (``[tokens, kv_heads, head_dim]``) at their slots."""
        kvnew = torch.stack((k, v)).transpose(1, 2)  # [2, kv_heads, tokens, hd]
        for part in plan.writes:
            src = kvnew if part.rows is None else kvnew.index_select(2, part.rows)
            self._layer_tokens(part.slab, layer).index_copy_(2, part.local, src)

    def gather_blocks(self, layer: int, parts: Sequence[SlabIndex],
                      num_blocks: int) -> torch.Tensor:
        """``num_blocks`` blocks of one layer, in the order of ``parts``' rows:
        ``[2, kv_heads, num_blocks * block_size, head_dim]`` (K then V; per head, the tokens of
        the blocks back to back, contiguous)."""
        nkv, bs, hd = self.num_kv_heads, self.block_size, self.head_dim
        shape = (2, nkv, num_blocks * bs, hd)
        if len(parts) == 1 and parts[0].rows is None:
            p = parts[0]
            src = self.slabs[p.slab][layer].view(2 * nkv, -1, bs * hd)
            return src.index_select(1, p.local).view(shape)
        out = torch.empty(2 * nkv, num_blocks, bs * hd, device=self.device, dtype=self.dtype)
        for p in parts:
            assert p.rows is not None  # only a single whole part goes without rows
            src = self.slabs[p.slab][layer].view(2 * nkv, -1, bs * hd)
            out.index_copy_(1, p.rows, src.index_select(1, p.local))
        return out.view(shape)

    def gather(self, layer: int, table: GatherTable) -> torch.Tensor:
        """The blocks of a table: ``[2, kv_heads, rows, max_blocks * block_size, head_dim]``."""
        flat = self.gather_blocks(layer, table.parts, table.rows * table.max_blocks)
        return flat.view(2, self.num_kv_heads, table.rows, -1, self.head_dim)

    def tokens(self, layer: int, block_ids: Sequence[int], length: int) -> torch.Tensor:
        """The first ``length`` tokens of a block table, ``[length, 2, kv_heads, head_dim]``
        (for tests and inspection; the model reads through :meth:`gather_blocks`)."""
        need = -(-length // self.block_size)
        if need > len(block_ids):
            raise ValueError(f"{length} tokens need {need} blocks, the table has "
                             f"{len(block_ids)}")
        ids = np.asarray(block_ids[:need], dtype=np.int64)
        kv = self.gather_blocks(layer, self.split_blocks(ids), need)[:, :, :length]
        return kv.permute(2, 0, 1, 3)
