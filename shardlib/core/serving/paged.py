"""The model step on one rank: the Llama layers split over tensor parallelism, K/V in a paged cache.

Each rank holds its share of every layer (Shoeybi et al. 2019): the query heads and the KV heads split
(``core.tensor_parallel.layers``: q, k, v, gate and up column-parallel, o and down row-parallel, one
all-reduce after each), the KV heads copied when there are fewer than ranks (``predict.shapes.kv_head_copies``'s
rule), the embedding, final norm and head whole. The cache (Kwon et al. 2023) is this rank's K and V
for its KV heads, ``num_blocks x block_size`` token slots a layer; token ``p`` of a sequence sits in slot
``table[p // block_size] * block_size + p % block_size``. A step takes chunks of many sequences (new
prompts, prompt pieces, one-token decodes), writes their K/V into their slots, and each chunk's queries
read their sequence's K/V back through its block table (the paged read). The step's one-token decodes
are read and attended together, their contexts padded to the longest and the padding masked (what a
paged-attention kernel does for a batch of decodes); prompt chunks one by one. The sums go through the
``TPGroup`` (no ``torch.distributed`` here).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from shardlib.core.serving.llama import LlamaWeights, attend, rotary
from shardlib.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, TPGroup
from shardlib.core.toy import rms_norm


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


def _kv_weight(w: torch.Tensor, n_kv: int, head_dim: int, tp: int) -> torch.Tensor:
    """k or v's ``(n_kv hd, d)`` weight, each KV head repeated when ``tp > n_kv`` so every rank has one."""
    if tp <= n_kv:
        return w
    return w.view(n_kv, head_dim, -1).repeat_interleave(tp // n_kv, dim=0).flatten(0, 1)  # (tp hd, d)


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


class Layer(torch.nn.Module):
    """One Llama layer's share on this rank."""

    def __init__(self, w: dict, config, tpg: TPGroup) -> None:
        super().__init__()
        c, tp = config, tpg.tp
        self.config, self.tpg = c, tpg
        self.heads, self.kv_heads = c.n_heads // tp, max(1, c.n_kv_heads // tp)
        self.q = ColumnParallelLinear(w["q"], None, tpg)  # (H/tp hd, d)
        self.k = ColumnParallelLinear(_kv_weight(w["k"], c.n_kv_heads, c.head_dim, tp), None, tpg)
        self.v = ColumnParallelLinear(_kv_weight(w["v"], c.n_kv_heads, c.head_dim, tp), None, tpg)
        self.o = RowParallelLinear(w["o"], None, tpg)  # (d, H/tp hd)
        self.gate, self.up = ColumnParallelLinear(w["gate"], None, tpg), ColumnParallelLinear(w["up"], None, tpg)
        self.down = RowParallelLinear(w["down"], None, tpg)  # (d, d_ff/tp)
        self.attn_norm, self.mlp_norm = w["attn_norm"], w["mlp_norm"]

    def forward(self, h, positions, spans, cache: KVCache, layer: int, decodes=None):
        """``h`` (tokens, d) of every chunk end to end; ``spans``: per prompt chunk, (its rows, its new slots,
        the slots of its whole sequence so far, its positions); ``decodes``: the one-token chunks together,
        (their rows, their new slots, their contexts' slots (n, longest), which of those are real)."""
        c = self.config
        x = rms_norm(h, self.attn_norm, c.rms_eps, torch.float32)
        q = rotary(self.q.local(x).view(-1, self.heads, c.head_dim), positions, c.rope_theta)  # (tokens, H/tp, hd)
        k = rotary(self.k.local(x).view(-1, self.kv_heads, c.head_dim), positions, c.rope_theta)
        v = self.v.local(x).view(-1, self.kv_heads, c.head_dim)
        out = torch.empty_like(q)
        for rows, new_slots, all_slots, pos in spans:
            cache.write(layer, new_slots, k[rows], v[rows])
            k_seq, v_seq = cache.read(layer, all_slots)  # the paged read: (context, kv heads here, hd)
            out[rows] = attend(q[rows], k_seq, v_seq, pos)
        if decodes is not None:
            rows, new_slots, slot_matrix, valid = decodes
            cache.write(layer, new_slots, k[rows], v[rows])
            k_ctx, v_ctx = cache.read(layer, slot_matrix)  # (n, longest context, kv heads here, hd)
            out[rows] = attend_decodes(q[rows], k_ctx, v_ctx, valid)
        h = h + self.tpg.all_reduce(self.o.partial(out.flatten(1)))  # (tokens, d): every rank's heads summed
        x = rms_norm(h, self.mlp_norm, c.rms_eps, torch.float32)
        return h + self.tpg.all_reduce(self.down.partial(F.silu(self.gate.local(x)) * self.up.local(x)))


class PagedModel(torch.nn.Module):
    """This rank's share of the model and its KV cache; ``step(chunks)`` runs one engine step."""

    def __init__(self, weights: LlamaWeights, tpg: TPGroup, num_blocks: int, block_size: int, device="cpu") -> None:
        super().__init__()
        c = weights.config
        self.config, self.tpg, self.device = c, tpg, device
        self.embed, self.norm, self.head = weights.embed.to(device), weights.norm.to(device), weights.head.to(device)
        self.layers = torch.nn.ModuleList(Layer({k: t.to(device) for k, t in w.items()}, c, tpg)
                                          for w in weights.layers)
        self.cache = KVCache(c.n_layers, num_blocks, block_size, self.layers[0].kv_heads, c.head_dim,
                             weights.dtype, device)

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
        for i, layer in enumerate(self.layers):
            h = layer(h, positions, spans, self.cache, i, decodes)
            if on_layer is not None:
                on_layer(i)
        h = h[last_rows]
        return F.linear(rms_norm(h, self.norm, self.config.rms_eps, torch.float32), self.head)  # (sampled, V)

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
