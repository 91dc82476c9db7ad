"""The torch executor's paged KV cache, held in slabs that can be freed, and the per-iteration
attention plan that tells the model where every token's K/V goes and what each attention reads.

Layout. Block ``b`` lives in slab ``b // slab_blocks`` at index ``b % slab_blocks``. Every slab is
``[layers, blocks, block_size, 2, kv_heads, head_dim]`` (K and V side by side, so one gather per
layer and slab fetches both). All slabs but the last hold ``slab_blocks`` blocks; the last holds
exactly the remainder, so the bytes held are exactly ``num_blocks * block bytes``: resizing
drops or adds whole slabs and reallocates at most the last one, so a resize never needs more
than one slab of extra memory (one contiguous pool would need old + new at once).

The engine's block pool hands out the lowest free ids first, so the blocks in use crowd the low
slabs and a gather usually touches one or two of them.

Plans are built on the CPU with numpy (block tables are Python lists in the engine) and copied
to the device once per iteration; the model then runs without host round trips.
"""

from __future__ import annotations

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
    """Consecutive decode rows ``start .. stop-1`` attended in one batched call."""

    start: int
    stop: int
    table: GatherTable
    mask: torch.Tensor
    """``[rows, 1, 1, max_blocks * block_size]`` True where a key position is within context"""


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
        return torch.zeros(self.num_layers, blocks, self.block_size, 2, self.num_kv_heads,
                           self.head_dim, device=self.device, dtype=self.dtype)

    # ------------------------------------------------------------------ resize
    @torch.no_grad()
    def resize(self, num_blocks: int, moves: dict[int, int]) -> None:
        """Copy block ``src`` to ``dst`` for every move, then hold exactly ``num_blocks``."""
        if num_blocks < 1:
            raise ValueError(f"a KV cache needs at least 1 block, got {num_blocks}")
        B = self.slab_blocks
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
                self.slabs[ds][:, di] = self.slabs[ss][:, si]
        sizes = [B] * (num_blocks // B) + ([num_blocks % B] if num_blocks % B else [])
        freed = False
        while len(self.slabs) > len(sizes):  # release whole slabs first, to keep the peak low
            self.slabs.pop()
            freed = True
        for i, size in enumerate(sizes):
            if i < len(self.slabs):
                old = self.slabs[i]
                if old.shape[1] != size:  # the last slab: reallocate to the exact size
                    new = self._new_slab(size)
                    keep = min(size, old.shape[1])
                    new[:, :keep] = old[:, :keep]
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
    def write(self, layer: int, plan: AttentionPlan, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the packed tokens' K and V (``[tokens, kv_heads, head_dim]``) at their slots."""
        kvnew = torch.stack((k, v), dim=1)  # [tokens, 2, kv_heads, hd]
        for part in plan.writes:
            dst = self.slabs[part.slab][layer].view(-1, 2, self.num_kv_heads, self.head_dim)
            src = kvnew if part.rows is None else kvnew.index_select(0, part.rows)
            dst.index_copy_(0, part.local, src)

    def gather(self, layer: int, table: GatherTable) -> torch.Tensor:
        """The blocks of a table: ``[rows, max_blocks, block_size, 2, kv_heads, head_dim]``."""
        shape = (table.rows, table.max_blocks, self.block_size, 2, self.num_kv_heads,
                 self.head_dim)
        if len(table.parts) == 1 and table.parts[0].rows is None:
            p = table.parts[0]
            return self.slabs[p.slab][layer].index_select(0, p.local).view(shape)
        out = torch.empty(table.rows * table.max_blocks, *shape[2:], device=self.device,
                          dtype=self.dtype)
        for p in table.parts:
            out.index_copy_(0, p.rows, self.slabs[p.slab][layer].index_select(0, p.local))
        return out.view(shape)
