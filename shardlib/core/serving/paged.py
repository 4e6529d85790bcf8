"""The model step on one rank: the Llama (or Mixtral) layers split over tensor parallelism, K/V in a paged cache.

Each rank holds its share of every layer (Shoeybi et al. 2019): ``tensor_parallel.blocks.ParallelBlock``,
the query and KV heads split, the KV heads copied when there are fewer than ranks, one all-reduce after
the attention and one after the MLP (with experts, Mixtral's: spread whole over the ranks, the tokens sent to
them by all-to-all); the embedding, final norm and head whole. The cache (Kwon et al. 2023) is this rank's K
and V for its KV heads, ``num_blocks x block_size`` token slots a layer; token ``p`` of a sequence sits in
slot ``table[p // block_size] * block_size + p % block_size``. A step takes chunks of many sequences (new
prompts, prompt pieces, one-token decodes); its slot map (every new token's slot, each context's slots) is
built once, and every layer reuses it. The blocks' attention calls ``PagedModel.attend``: it writes the step's
new K/V into their slots in one go, and each chunk's queries read their sequence's K/V back through its block
table (the paged read). The step's one-token decodes are read and attended together, their contexts padded to
the longest and the padding masked (what a paged-attention kernel does for a batch of decodes); prompt chunks
one by one. The sums go through the ``TPGroup``.
"""

from __future__ import annotations

from functools import partial
from itertools import accumulate
from typing import NamedTuple

import torch
import torch.nn.functional as F

from shardlib.core.model import LlamaWeights, attention, norm
from shardlib.core.tensor_parallel.blocks import ParallelBlock
from shardlib.core.tensor_parallel.layers import TPGroup


class KVCache:
    """This rank's K and V: ``(layers, num_blocks x block_size, kv heads here, head_dim)`` each. With
    ``values_in_keys`` (MLA's latent), one tensor: each entry is the key, its first ``values_in_keys`` values
    the value."""

    def __init__(self, n_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device, values_in_keys: int = 0) -> None:
        shape = (n_layers, num_blocks * block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = None if values_in_keys else torch.zeros(shape, dtype=dtype, device=device)
        self.block_size, self.values_in_keys = block_size, values_in_keys
        self.entries_written = 0  # tokens' K/V (or latents) stored here, each time one is computed

    @property
    def size_bytes(self) -> int:
        return sum(c.numel() * c.element_size() for c in (self.k, self.v) if c is not None)

    def slots(self, table, positions: torch.Tensor) -> torch.Tensor:
        """The slot of each position through its block table: ``table`` (..., blocks), ``positions`` (..., n)."""
        table = torch.as_tensor(table, device=positions.device)
        return table.gather(-1, positions // self.block_size) * self.block_size + positions % self.block_size

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer, slots] = k  # (tokens, kv heads here, hd)
        self.entries_written += slots.numel() if layer == 0 else 0
        if self.v is not None:
            self.v[layer, slots] = v

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V at ``slots`` (any shape): (*slots' shape, kv heads here, hd), copied whole rows at a time
        (``index_select``: several times faster on CPU than indexing with a tensor)."""
        shape = (*slots.shape, *self.k.shape[2:])
        k = self.k[layer].index_select(0, slots.flatten()).view(shape)
        if self.v is None:
            return k, k[..., :self.values_in_keys]
        return k, self.v[layer].index_select(0, slots.flatten()).view(shape)


def attend_decodes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor,
                   scale: float | None = None) -> torch.Tensor:
    """One new query per sequence on its own keys: ``q`` (n, heads, hd); ``k``, ``v`` (n, context, kv heads,
    hd), each row's context padded to the longest; ``valid`` (n, context) marks the real keys (a padded key
    gets weight exactly 0); query head h reads KV head h // (heads / kv heads). Returns (n, heads, v's hd). One
    call of torch's fused kernel (it takes 4-d tensors only; 3-d ones go the unfused way)."""
    return F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2),  # (n, heads, 1, hd)
                                          attn_mask=valid[:, None, None, :], enable_gqa=True, scale=scale)[:, :, 0]


class SlotMap(NamedTuple):
    """A step's places in the cache, built once and read by every layer."""

    new: torch.Tensor  # (tokens,) the slot of each new token's K/V
    prompts: list  # per prompt chunk: its rows, its sequence's slots (context,), its positions (rows,)
    decodes: tuple | None  # the one-token chunks: rows (n,), their contexts' slots (n, longest), which are real


class PagedModel(torch.nn.Module):
    """This rank's share of the model and its KV cache; ``step(chunks)`` runs one engine step."""

    def __init__(self, weights: LlamaWeights, tpg: TPGroup, num_blocks: int, block_size: int, device="cpu",
                 experts: TPGroup | None = None) -> None:
        """``experts``: attention data-parallel (DeepSeek-V3's decode layout): this rank holds every head and
        dense MLP whole (``tpg`` of one rank) and runs only its own sequences, the experts spread over ``experts``."""
        super().__init__()
        c = weights.config
        self.config, self.tpg, self.device = c, tpg, device
        self.embed, self.norm, self.head = weights.embed.to(device), weights.norm.to(device), weights.head.to(device)
        self.layers = torch.nn.ModuleList(ParallelBlock({k: t.to(device) for k, t in w.items()}, c, tpg, copy_kv=True,
                                                        experts=experts) for w in weights.layers)
        self.kv_heads = self.layers[0].attention.kv_heads  # KV heads on this rank (MLA: 1, its latent)
        entry, values = (c.mla.latent_dim, c.mla.kv_rank) if c.mla else (c.head_dim, 0)
        self.cache = KVCache(c.n_layers, num_blocks, block_size, self.kv_heads, entry, weights.dtype, device, values)

    @torch.no_grad()
    def step(self, chunks, on_layer=None) -> torch.Tensor:
        """Logits ``(sampled chunks, V)`` of the last token of each chunk with ``sample`` set, in order (no chunks:
        only the layers' collectives joined). ``on_layer(i)``, if given, runs once layer ``i``'s K/V are in the
        cache (a hand-off sends them)."""
        tokens = torch.tensor([t for ch in chunks for t in ch.tokens], dtype=torch.long, device=self.device)
        positions = torch.tensor([p for ch in chunks for p in range(ch.start, ch.start + len(ch.tokens))],
                                 dtype=torch.long, device=self.device)
        slots = self.slot_map(chunks, positions)
        h = self.embed[tokens]  # (tokens, d)
        for i, block in enumerate(self.layers):
            h = block(h, positions, partial(self.attend, i, slots))
            if on_layer is not None:
                on_layer(i)
        h = h[[at - 1 for ch, at in zip(chunks, accumulate(len(ch.tokens) for ch in chunks)) if ch.sample]]
        return F.linear(norm(h, self.norm, self.config), self.head)  # (sampled, V)

    def slot_map(self, chunks, positions: torch.Tensor) -> SlotMap:
        """The step's ``SlotMap``, through each chunk's block table (padded to the widest: never read there)."""
        dev, n = self.device, [len(ch.tokens) for ch in chunks]
        if not chunks:
            return SlotMap(positions, [], None)
        at = [0, *accumulate(n)]  # chunk i's rows: at[i] .. at[i + 1] - 1
        width = max(len(ch.table) for ch in chunks)
        tables = torch.tensor([ch.table + (0,) * (width - len(ch.table)) for ch in chunks], device=dev)  # (chunks, w)
        owner = torch.repeat_interleave(torch.tensor(n, device=dev))  # (tokens,) the chunk of each token
        new = self.cache.slots(tables[owner], positions[:, None])[:, 0]  # (tokens,)
        prompts = [(slice(at[i], at[i + 1]), self.cache.slots(tables[i], torch.arange(ch.start + n[i], device=dev)),
                    positions[at[i]:at[i + 1]]) for i, ch in enumerate(chunks) if n[i] > 1]
        one = [i for i in range(len(chunks)) if n[i] == 1]
        if not one:
            return SlotMap(new, prompts, None)
        rows = torch.tensor([at[i] for i in one], device=dev)
        context = positions[rows] + 1  # (n,) keys, the new one included
        keys = torch.arange(int(context.max()), device=dev)
        padded = torch.minimum(keys, context[:, None] - 1)  # (n, longest): a padded key repeats a real one
        return SlotMap(new, prompts, (rows, self.cache.slots(tables[one], padded), keys < context[:, None]))

    def attend(self, layer: int, slots: SlotMap, q, k, v, scale: float | None = None) -> torch.Tensor:
        """Layer ``layer``'s attention through the cache. ``q`` (H here, tokens, hd) and ``k, v`` (KV here,
        tokens, hd) of every chunk end to end (MLA: one entry a token, ``v`` a view of it); ``slots``: the step's
        ``SlotMap``. A prompt chunk attends as a batch of one (4-d, for the fused kernel), the decodes as one
        batch."""
        self.cache.write(layer, slots.new, k.transpose(0, 1), v.transpose(0, 1))  # every chunk's new K/V at once
        out = q.new_empty(*q.shape[:-1], v.shape[-1])  # (H here, tokens, v's hd)
        for rows, seq_slots, pos in slots.prompts:
            k_seq, v_seq = self.cache.read(layer, seq_slots[None])  # the paged read: (1, context, KV here, hd)
            out[:, rows] = attention(q[None, :, rows], k_seq.transpose(1, 2), v_seq.transpose(1, 2), pos,
                                     scale=scale)[0]
        if slots.decodes is not None:
            rows, slot_matrix, valid = slots.decodes
            k_ctx, v_ctx = self.cache.read(layer, slot_matrix)  # (n, longest context, KV here, hd)
            out[:, rows] = attend_decodes(q[:, rows].transpose(0, 1), k_ctx, v_ctx, valid, scale).transpose(0, 1)
        return out
