"""The transformer: Llama's (Touvron et al. 2023), as one process computes it; every sharded run is checked on it.

A block is pre-norm and residual: ``h + attention(norm(h))`` then ``+ mlp(norm(.))``. RMSNorm (Zhang and
Sennrich 2019) with an optional weight; causal grouped-query attention (Ainslie et al. 2023) on rotary
positions (Su et al. 2021, the rotate-half form); the SwiGLU MLP ``down(silu(gate(x)) * up(x))`` (Shazeer
2020). A layer is a dict of ``(out, in)`` matrices ``q, k, v, o, gate, up, down`` and norm vectors
``attn_norm, mlp_norm``; it may hold only the attention or only the MLP, and no norm weights. Mixtral's (Jiang
et al. 2024) holds a ``router`` and ``expert_gate, expert_up, expert_down`` ``(n_experts, out, in)`` instead of
``gate, up, down``, run by the ``moe`` passed in (``core.experts.dispatch.moe_reference``: the experts sit above
this module). The ``ModelConfig`` says the rest: no rotary when ``rope_theta`` is 0, the norm in float32 when
``norm_float32`` (``transformers``' Llama). DeepSeek's multi-head latent attention (``latent_attention``) stands
in for the grouped-query one where a layer holds ``kv_a``. Two configs of it run in the course: the toy
(``core.toy``: blocks only, no rotary, no norm weights) and the served model (``LlamaWeights``: embedding, blocks,
final norm and head, read from ``transformers`` by ``core.checkpoints``, or drawn by ``random_weights``).
``greedy_reference`` recomputes the whole sequence at every token: slow, plainly right. Pure: torch, no
``torch.distributed``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from shardlib.core.config import ModelConfig


# -- the pieces ---------------------------------------------------------------------------------------
def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 0.0,
             float32: bool = False) -> torch.Tensor:
    """RMSNorm over the last dim, computed in float32 if ``float32`` (else in ``x``'s dtype) and cast back,
    then times ``weight`` (``None``: no learned scale). ``eps`` 0: the computing dtype's machine epsilon."""
    h = x.to(torch.float32) if float32 else x
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + (eps or torch.finfo(h.dtype).eps))
    return h.to(x.dtype) if weight is None else weight * h.to(x.dtype)


def norm(h: torch.Tensor, weight: torch.Tensor | None, model: ModelConfig) -> torch.Tensor:
    """``rms_norm`` as ``model`` computes it (its epsilon, its computing dtype)."""
    return rms_norm(h, weight, model.rms_eps, model.norm_float32)


@functools.lru_cache(maxsize=1)  # every layer of a step rotates at the same positions tensor: one table a step
def rotary_table(positions: torch.Tensor, dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """cos and sin (seq, dim) of the rotary angles at ``positions``, computed in float32 as ``transformers`` does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64, device=positions.device).float() / dim))
    angles = positions.to(torch.float32)[:, None] * inv_freq  # (seq, dim / 2)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotary(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding of ``x`` (..., heads, seq, head_dim) at ``positions`` (seq,) (``rotary_table``);
    ``theta`` 0: ``x`` itself (no rotary)."""
    if not theta:
        return x
    dim = x.shape[-1]
    cos, sin = rotary_table(positions, dim, theta, x.dtype)  # (seq, head_dim)
    half = torch.cat([-x[..., dim // 2:], x[..., :dim // 2]], dim=-1)
    return x * cos + half * sin


def split_heads(t: torch.Tensor, n_heads: int) -> torch.Tensor:
    """``(..., seq, n_heads * head_dim)`` to ``(..., n_heads, seq, head_dim)``."""
    return t.unflatten(-1, (n_heads, -1)).transpose(-3, -2)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_positions: torch.Tensor | None = None,
              causal: bool = True, scale: float | None = None) -> torch.Tensor:
    """Attention of ``q`` (..., H, new, hd) at ``q_positions`` on ``k, v`` (..., KV, context, hd) at places
    ``0 .. context - 1``; query head ``h`` reads KV head ``h // (H / KV)``. ``q_positions`` ``None``: the
    whole sequence (``new == context``), no mask kept. ``causal=False``: every query reads every key.
    ``scale``: default ``1 / sqrt(hd)``. Returns (..., H, new, hd)."""
    group = q.shape[-3] // k.shape[-3]  # query heads per KV head
    k, v = k.repeat_interleave(group, dim=-3), v.repeat_interleave(group, dim=-3)  # (..., H, context, hd)
    if q_positions is None or not causal:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
    visible = torch.arange(k.shape[-2], device=q.device)[None, :] <= q_positions[:, None]  # (new, context)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def attention_layer_reference(x: torch.Tensor, w: dict, model: ModelConfig,
                              positions: torch.Tensor | None = None, attend=None) -> torch.Tensor:
    """Grouped-query attention on ``x`` (..., seq, d_model) with the heads ``w``'s ``q, k, v, o`` hold (all of
    them, or one rank's share: then the output is that rank's share of the sum). ``positions`` (seq,),
    default ``0 .. seq - 1``; ``attend(q, k, v)``, default ``attention``, sees the rotated
    q (..., H, seq, hd) and k, v (..., KV, seq, hd) (a paged cache or a ring may stand in)."""
    hd, theta = model.head_dim, model.rope_theta
    at = torch.arange(x.shape[-2], device=x.device) if positions is None else positions
    q = rotary(split_heads(F.linear(x, w["q"]), w["q"].shape[0] // hd), at, theta)  # (..., H, seq, hd)
    k = rotary(split_heads(F.linear(x, w["k"]), w["k"].shape[0] // hd), at, theta)  # (..., KV, seq, hd)
    v = split_heads(F.linear(x, w["v"]), w["v"].shape[0] // hd)
    o = attention(q, k, v, positions) if attend is None else attend(q, k, v)  # (..., H, seq, hd)
    return F.linear(o.transpose(-3, -2).flatten(-2), w["o"])  # (..., seq, d_model)


# -- multi-head latent attention (DeepSeek-V2, arXiv 2405.04434, section 2.1; DeepSeek-V3, section 2.1.1) ----------
LATENT_NORM_EPS = 1e-6  # the two low-rank norms' epsilon in transformers' DeepSeek-V3, whatever the config says


def interleaved_rotary(x: torch.Tensor, positions: torch.Tensor, theta: float, interleaved: bool) -> torch.Tensor:
    """``rotary`` on ``x`` (..., seq, rope_dim); ``interleaved``: its pairs laid out ``(x0, x1), (x2, x3), ...``
    are first gathered into two halves, evens then odds (the same rotation; the result in halves)."""
    return rotary(torch.cat([x[..., 0::2], x[..., 1::2]], dim=-1) if interleaved else x, positions, theta)


def latent_queries_and_entry(x: torch.Tensor, w: dict, model: ModelConfig, positions: torch.Tensor):
    """MLA's first half on ``x`` (..., seq, d_model) for the heads ``w``'s ``q`` or ``q_b`` hold: each head's
    query without rotary (..., H, seq, nope_dim) and with it (..., H, seq, rope_dim), rotated; and what each
    token caches, its normed latent and its rotated shared key, (..., seq, kv_rank + rope_dim)."""
    m = model.mla
    q = F.linear(rms_norm(F.linear(x, w["q_a"]), w["q_a_norm"], LATENT_NORM_EPS, True), w["q_b"]) if "q_a" in w \
        else F.linear(x, w["q"])  # (..., seq, H qk_dim)
    q_nope, q_rope = split_heads(q, q.shape[-1] // m.qk_dim).split([m.nope_dim, m.rope_dim], dim=-1)
    latent, k_rope = F.linear(x, w["kv_a"]).split([m.kv_rank, m.rope_dim], dim=-1)  # (..., seq, kv_rank), rope
    latent = rms_norm(latent, w["kv_a_norm"], LATENT_NORM_EPS, True)
    q_rope = interleaved_rotary(q_rope, positions, model.rope_theta, m.interleaved)  # (..., H, seq, rope_dim)
    k_rope = interleaved_rotary(k_rope, positions, model.rope_theta, m.interleaved)  # (..., seq, rope_dim)
    return q_nope, q_rope, torch.cat([latent, k_rope], dim=-1)  # entry: (..., seq, latent_dim)


def latent_attention_reference(x: torch.Tensor, w: dict, model: ModelConfig,
                               positions: torch.Tensor | None = None) -> torch.Tensor:
    """MLA as the paper writes it, every head's key and value rebuilt from the latent: ``k = [W_UK c, k_rope]``,
    ``v = W_UV c``, softmax scale ``1 / sqrt(nope_dim + rope_dim)``. (..., seq, d_model) in and out."""
    m, at = model.mla, torch.arange(x.shape[-2], device=x.device) if positions is None else positions
    q_nope, q_rope, entry = latent_queries_and_entry(x, w, model, at)
    kv = split_heads(F.linear(entry[..., :m.kv_rank], w["kv_b"]), q_nope.shape[-3])  # (..., H, seq, nope + v)
    k_nope, v = kv.split([m.nope_dim, m.v_dim], dim=-1)
    k = torch.cat([k_nope, entry[..., None, :, m.kv_rank:].expand(*k_nope.shape[:-1], m.rope_dim)], dim=-1)
    o = attention(torch.cat([q_nope, q_rope], dim=-1), k, v, positions, scale=m.qk_dim ** -0.5)  # (..., H, seq, v)
    return F.linear(o.transpose(-3, -2).flatten(-2), w["o"])


def latent_attention(x: torch.Tensor, w: dict, model: ModelConfig, positions: torch.Tensor | None = None,
                     attend=None) -> torch.Tensor:
    """MLA as it is served (DeepSeek-V2, section 2.1.2: ``W_UK`` absorbed into the query, ``W_UV`` into the
    output): each head's query moved into the latent's space, ``[q_nope W_UK, q_rope]`` (..., H, seq, latent_dim),
    attends the cached entries as one shared key (multi-query attention), the values being their latent part;
    the heads' results, (..., H, seq, kv_rank), go back up through ``W_UV``. ``attend(q, k, v, scale)``, default
    ``attention``, sees k (..., 1, seq, latent_dim) and v its first kv_rank values (a paged cache may stand in).
    The heads ``w``'s ``q_b`` and ``kv_b`` hold (one rank's share: then the output is to be summed)."""
    m, at = model.mla, torch.arange(x.shape[-2], device=x.device) if positions is None else positions
    q_nope, q_rope, entry = latent_queries_and_entry(x, w, model, at)
    up = w["kv_b"].view(q_nope.shape[-3], m.nope_dim + m.v_dim, m.kv_rank)  # (H, nope + v, kv_rank)
    q = torch.cat([q_nope @ up[:, :m.nope_dim], q_rope], dim=-1)  # (..., H, seq, latent_dim)
    k = entry[..., None, :, :]  # (..., 1, seq, latent_dim): one key shared by every head
    o = attention(q, k, k[..., :m.kv_rank], positions, scale=m.qk_dim ** -0.5) if attend is None \
        else attend(q, k, k[..., :m.kv_rank], scale=m.qk_dim ** -0.5)  # (..., H, seq, kv_rank)
    o = o @ up[:, m.nope_dim:].transpose(-1, -2)  # (..., H, seq, v_dim)
    return F.linear(o.transpose(-3, -2).flatten(-2), w["o"])


def mlp_reference(x: torch.Tensor, w_gate, w_up, w_down) -> torch.Tensor:
    """The gated MLP of Llama and Mixtral experts: ``down(silu(gate(x)) * up(x))``."""
    return F.linear(F.silu(F.linear(x, w_gate)) * F.linear(x, w_up), w_down)


def block_reference(h: torch.Tensor, w: dict, model: ModelConfig, positions: torch.Tensor | None = None,
                    moe=None) -> torch.Tensor:
    """One block, unsharded: ``h + attention(norm(h))`` if ``w`` has attention weights, then
    ``+ mlp(norm(.))`` if it has MLP weights, or ``+ moe(norm(.), w, model)`` if it has a router.
    Shape kept: (..., seq, d_model)."""
    if "kv_a" in w:
        h = h + latent_attention_reference(norm(h, w.get("attn_norm"), model), w, model, positions)
    elif "q" in w:
        h = h + attention_layer_reference(norm(h, w.get("attn_norm"), model), w, model, positions)
    if "gate" in w:
        h = h + mlp_reference(norm(h, w.get("mlp_norm"), model), w["gate"], w["up"], w["down"])
    elif "router" in w:
        if moe is None:
            raise ValueError("this block has experts: pass moe=core.experts.dispatch.moe_reference to run them")
        h = h + moe(norm(h, w.get("mlp_norm"), model), w, model)
    return h


def stack_reference(x: torch.Tensor, layers, model: ModelConfig, positions: torch.Tensor | None = None,
                    moe=None) -> torch.Tensor:
    """The whole stack of blocks in one process (``moe``: as ``block_reference`` takes it)."""
    for w in layers:
        x = block_reference(x, w, model, positions, moe)
    return x


# -- the served model: embedding, blocks, final norm, head ---------------------------------------------
@dataclass(frozen=True)
class LlamaWeights:
    """The whole model's weights: ``embed`` (V, d), ``norm`` (d,), ``head`` (V, d), and per layer a dict of
    ``q, k, v, o, gate, up, down`` (``(out, in)`` matrices) and ``attn_norm, mlp_norm`` (vectors); with experts
    (Mixtral) ``router`` (E, d) and ``expert_gate, expert_up, expert_down`` (E, out, in) for the MLP."""

    config: ModelConfig
    embed: torch.Tensor
    norm: torch.Tensor
    head: torch.Tensor
    layers: tuple[dict, ...] = field(repr=False)

    def __post_init__(self) -> None:
        c = self.config
        if len(self.layers) != c.n_layers:
            raise ValueError(f"the config has {c.n_layers} layers but {len(self.layers)} were given")
        if tuple(self.embed.shape) != (c.vocab_size, c.d_model):
            raise ValueError(f"embed is {tuple(self.embed.shape)}, the config says ({c.vocab_size}, {c.d_model})")

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype


def forward_reference(weights: LlamaWeights, token_ids: torch.Tensor, moe=None) -> torch.Tensor:
    """Logits (tokens, V) of one whole sequence, in one process, with no cache (``moe``: see
    ``block_reference``)."""
    c = weights.config
    h = stack_reference(weights.embed[token_ids], weights.layers, c, moe=moe)  # (tokens, d)
    return F.linear(norm(h, weights.norm, c), weights.head)


def greedy_reference(weights: LlamaWeights, prompt_token_ids, max_new_tokens: int, moe=None) -> tuple[int, ...]:
    """Greedy decoding of one prompt, the whole sequence recomputed at every step."""
    tokens = list(prompt_token_ids)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            tokens.append(int(forward_reference(weights, torch.tensor(tokens), moe)[-1].argmax()))
    return tuple(tokens[len(prompt_token_ids):])


def random_weights(config: ModelConfig, seed: int = 0, dtype: torch.dtype = torch.float32,
                   scale: float = 0.3) -> LlamaWeights:
    """Seeded random weights of ``config``'s shape, made here (no ``transformers``, nothing downloaded):
    every matrix (a router's selection bias too) normal with standard deviation ``scale``, the norms' weights
    1. A Llama's, or with ``mla`` and experts (past ``dense_layers``, beside ``shared_experts``) DeepSeek-V3's."""
    g, c = torch.Generator().manual_seed(seed), config

    def matrix(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype)

    def ones(n: int) -> torch.Tensor:
        return torch.ones(n, dtype=dtype)

    def layer(i: int) -> dict:
        m, h, d, w = c.mla, c.n_heads, c.d_model, c.expert_width
        if m is None:
            attention = {"q": matrix(h * c.head_dim, d), "k": matrix(c.n_kv_heads * c.head_dim, d),
                         "v": matrix(c.n_kv_heads * c.head_dim, d), "o": matrix(d, h * c.head_dim)}
        else:
            query = ({"q_a": matrix(m.q_rank, d), "q_a_norm": ones(m.q_rank), "q_b": matrix(h * m.qk_dim, m.q_rank)}
                     if m.q_rank else {"q": matrix(h * m.qk_dim, d)})
            attention = {**query,
                         "kv_a": matrix(m.latent_dim, d), "kv_a_norm": ones(m.kv_rank),
                         "kv_b": matrix(h * (m.nope_dim + m.v_dim), m.kv_rank), "o": matrix(d, h * m.v_dim)}
        if not c.is_moe or i < c.dense_layers:
            mlp = {"gate": matrix(c.d_ff, d), "up": matrix(c.d_ff, d), "down": matrix(d, c.d_ff)}
        else:
            e, shared = c.n_experts, w * c.shared_experts
            mlp = {"router": matrix(e, d), "expert_gate": matrix(e, w, d), "expert_up": matrix(e, w, d),
                   "expert_down": matrix(e, d, w),
                   **({"router_bias": matrix(e), "shared_gate": matrix(shared, d), "shared_up": matrix(shared, d),
                       "shared_down": matrix(d, shared)} if c.shared_experts else {})}
        return {**attention, **mlp, "attn_norm": ones(d), "mlp_norm": ones(d)}

    layers = tuple(layer(i) for i in range(c.n_layers))
    return LlamaWeights(c, matrix(c.vocab_size, c.d_model), ones(c.d_model), matrix(c.vocab_size, c.d_model), layers)
