"""The model step on one rank: the Llama (or Mixtral) layers split over tensor parallelism, K/V in a paged cache.

Each rank holds its share of every layer (Shoeybi et al. 2019): ``tensor_parallel.blocks.ParallelBlock``,
the query and KV heads split, the KV heads copied when there are fewer than ranks, one all-reduce after
the attention and one after the MLP (with experts, Mixtral's: spread whole over the ranks, the tokens sent to
them by all-to-all); the embedding, final norm and head whole. The cache (Kwon et al. 2023) is this rank's K
and V for its KV heads, ``num_blocks x block_size`` token slots a layer; token ``p`` of a sequence sits in
slot ``table[p // block_size] * block_size + p % block_size``. A step takes chunks of many sequences (new
prompts, prompt pieces, one-token decodes). The blocks' attention calls ``PagedModel.attend``: it writes the
chunks' K/V into their slots, and each chunk's queries read their sequence's K/V back through its block table
(the paged read). The step's one-token decodes are read and attended together, their contexts padded to the
longest and the padding masked (what a paged-attention kernel does for a batch of decodes); prompt chunks one
by one. The sums go through the ``TPGroup``.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F

from shardlib.core.model import LlamaWeights, attention, norm
from shardlib.core.tensor_parallel.blocks import ParallelBlock
from shardlib.core.tensor_parallel.layers import TPGroup


class KVCache:
    """This rank's K and V: ``(layers, num_blocks x block_size, kv heads here, head_dim)`` each."""

    def __init__(self, n_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device) -> None:
        shape = (n_layers, num_blocks * block_size, kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size

    @property
    def size_bytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def slots(self, table, positions: torch.Tensor) -> torch.Tensor:
        """The slot of each position, through the block table."""
        table = torch.as_tensor(table, device=positions.device)
        return table[positions // self.block_size] * self.block_size + positions % self.block_size

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer, slots], self.v[layer, slots] = k, v  # (tokens, kv heads here, hd)

    def read(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k[layer, slots], self.v[layer, slots]  # (context, kv heads here, hd)


def attend_decodes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """One new query per sequence on its own keys: ``q`` (n, heads, hd); ``k``, ``v`` (n, context, kv heads,
    hd), each row's context padded to the longest; ``valid`` (n, context) marks the real keys (a padded key
    gets weight exactly 0). Returns (n, heads, hd)."""
    n, heads, hd = q.shape
    kv_heads = k.shape[2]
    q = q.view(n, kv_heads, heads // kv_heads, hd)  # query head h reads KV head h // group: no copies of K/V
    scores = torch.einsum("nkgd,nckd->nkgc", q, k) * hd ** -0.5  # (n, kv heads, group, context)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    return torch.einsum("nkgc,nckd->nkgd", torch.softmax(scores, dim=-1), v).reshape(n, heads, hd)


class PagedModel(torch.nn.Module):
    """This rank's share of the model and its KV cache; ``step(chunks)`` runs one engine step."""

    def __init__(self, weights: LlamaWeights, tpg: TPGroup, num_blocks: int, block_size: int, device="cpu") -> None:
        super().__init__()
        c = weights.config
        self.config, self.tpg, self.device = c, tpg, device
        self.embed, self.norm, self.head = weights.embed.to(device), weights.norm.to(device), weights.head.to(device)
        self.layers = torch.nn.ModuleList(ParallelBlock({k: t.to(device) for k, t in w.items()}, c, tpg, copy_kv=True)
                                          for w in weights.layers)
        self.kv_heads = self.layers[0].attention.kv_heads  # KV heads on this rank
        self.cache = KVCache(c.n_layers, num_blocks, block_size, self.kv_heads, c.head_dim, weights.dtype, device)

    @torch.no_grad()
    def step(self, chunks, on_layer=None) -> torch.Tensor:
        """Logits ``(sampled chunks, V)`` of the last token of each chunk with ``sample`` set, in order.
        ``on_layer(i)``, if given, runs once layer ``i``'s K/V are in the cache (a hand-off sends them)."""
        tokens = torch.tensor([t for ch in chunks for t in ch.tokens], device=self.device)
        positions = torch.tensor([p for ch in chunks for p in range(ch.start, ch.start + len(ch.tokens))],
                                 device=self.device)
        spans, at, last_rows, one = [], 0, [], []
        for ch in chunks:
            n = len(ch.tokens)
            if n == 1:
                one.append((at, ch))
            else:
                seq_slots = self.cache.slots(ch.table, torch.arange(ch.start + n, device=self.device))
                spans.append((slice(at, at + n), seq_slots[ch.start:], seq_slots, positions[at:at + n]))
            if ch.sample:
                last_rows.append(at + n - 1)
            at += n
        decodes = self._decodes(one) if one else None
        h = self.embed[tokens]  # (tokens, d)
        for i, block in enumerate(self.layers):
            h = block(h, positions, partial(self.attend, i, spans, decodes))
            if on_layer is not None:
                on_layer(i)
        h = h[last_rows]
        return F.linear(norm(h, self.norm, self.config), self.head)  # (sampled, V)

    def attend(self, layer: int, spans, decodes, q, k, v) -> torch.Tensor:
        """Layer ``layer``'s attention through the cache. ``q`` (H here, tokens, hd) and ``k, v`` (KV here,
        tokens, hd) of every chunk end to end; ``spans``: per prompt chunk, (its rows, its new slots, the slots
        of its whole sequence so far, its positions); ``decodes``: the one-token chunks together, (their
        rows, their new slots, their contexts' slots (n, longest), which of those are real)."""
        k, v = k.transpose(0, 1), v.transpose(0, 1)  # (tokens, KV here, hd): the cache's layout
        out = torch.empty_like(q)  # (H here, tokens, hd)
        for rows, new_slots, all_slots, pos in spans:
            self.cache.write(layer, new_slots, k[rows], v[rows])
            k_seq, v_seq = self.cache.read(layer, all_slots)  # the paged read: (context, KV here, hd)
            out[:, rows] = attention(q[:, rows], k_seq.transpose(0, 1), v_seq.transpose(0, 1), pos)
        if decodes is not None:
            rows, new_slots, slot_matrix, valid = decodes
            self.cache.write(layer, new_slots, k[rows], v[rows])
            k_ctx, v_ctx = self.cache.read(layer, slot_matrix)  # (n, longest context, KV here, hd)
            out[:, rows] = attend_decodes(q[:, rows].transpose(0, 1), k_ctx, v_ctx, valid).transpose(0, 1)
        return out

    def _decodes(self, one):
        """The one-token chunks' rows, new slots, and their contexts' slots padded to the longest."""
        bs, dev = self.cache.block_size, self.device
        width = max(len(ch.table) for _, ch in one)
        tables = torch.tensor([ch.table + ch.table[-1:] * (width - len(ch.table)) for _, ch in one], device=dev)
        context = torch.tensor([ch.start + 1 for _, ch in one], device=dev)  # (n,) keys, the new one included
        pos = torch.arange(int(context.max()), device=dev)
        clamped = torch.minimum(pos[None, :], context[:, None] - 1)  # (n, longest): padding repeats a real slot
        slot_matrix = tables.gather(1, clamped // bs) * bs + clamped % bs
        rows = torch.tensor([at for at, _ in one], device=dev)
        return rows, slot_matrix[torch.arange(len(one), device=dev), context - 1], slot_matrix, \
            pos[None, :] < context[:, None]
