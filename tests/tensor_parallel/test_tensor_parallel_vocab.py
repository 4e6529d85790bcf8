"""The two ends of a language model split over the vocabulary: the embedding and the cross-entropy.

Tolerances. The ranks' loss is compared with ``F.cross_entropy`` within
``lab.measure.TOLERANCE`` (rtol = atol), never bit for bit, at every tp including 1: torch's
``log_softmax`` kernel adds the exponentials in its own (vectorised) order, ours adds them per slice and
then across slices, so the last bits differ (one float32 step, near 1e-6, on losses between 2 and 15).
The embedding is compared exactly: each token's row comes from one rank and the others add zeros, and
x + 0 is x.
"""

import pytest
import torch
import torch.nn.functional as F

from shardlib.core.checks import TOLERANCE, whole_number
from shardlib.core.tensor_parallel.layers import ColumnParallelLinear, TPGroup
from shardlib.core.tensor_parallel.sequence_parallel import ScatterToSequence
from shardlib.core.tensor_parallel.vocab import (
    VocabParallelEmbedding,
    check_vocab_split,
    vocab_parallel_cross_entropy,
    vocab_range,
)
from shardlib.lab.harness import on_ranks
from shardlib.lab.measure import SavedBytes
from shardlib.runtime.errors import RankError


# -- what the two ends should move and keep, set beside what the ranks measured ---------------------------
def vocab_parallel_loss_collectives(tokens: int, tp: int, element_bytes: int = 4) -> list[tuple[str, int]]:
    """The forward collectives of the vocabulary-parallel cross-entropy over ``tokens`` tokens (batch x
    sequence), as ``(op, size_bytes)``: three all-reduces of one value per token (the row max, the sum of
    exponentials, the target's logit), ``3 * tokens * element_bytes`` in all, whatever the vocabulary. Its
    backward sends nothing. One rank: nothing."""
    tokens, element_bytes = whole_number(tokens, "tokens"), whole_number(element_bytes, "element_bytes")
    return [] if whole_number(tp, "tp") == 1 else [("all_reduce", tokens * element_bytes)] * 3


def gathered_logits_collectives(tokens: int, vocab: int, tp: int, element_bytes: int = 4) -> list[tuple[str, int]]:
    """What the loss would move if the logit shards were gathered first (the naive way): one all-gather
    whose result is the whole ``tokens x vocab`` logits on every rank."""
    check_vocab_split(vocab, tp)
    tokens, element_bytes = whole_number(tokens, "tokens"), whole_number(element_bytes, "element_bytes")
    return [] if tp == 1 else [("all_gather", tokens * vocab * element_bytes)]


def vocab_embedding_collectives(tokens: int, d_model: int, tp: int, sequence_parallel: bool = False,
                                element_bytes: int = 4) -> list[tuple[str, int]]:
    """The forward collective of the vocabulary-parallel embedding: the partial lookups summed, an
    all-reduce of ``tokens x d_model`` values (a reduce-scatter of the same buffer with sequence
    parallelism, each rank keeping its tokens). Its backward sends nothing."""
    tokens, d_model = whole_number(tokens, "tokens"), whole_number(d_model, "d_model")
    if whole_number(tp, "tp") == 1:
        return []
    return [("reduce_scatter" if sequence_parallel else "all_reduce", tokens * d_model * element_bytes)]


def vocab_parallel_loss_saved_bytes(tokens: int, vocab: int, tp: int, element_bytes: int = 4) -> int:
    """What the vocabulary-parallel loss keeps for its backward on one rank: the softmax of its
    ``tokens x vocab / tp`` logits, and per token whether it owns the target (1 byte) and the target's row in
    its slice (an 8-byte index). The logits themselves need not be kept."""
    rows = check_vocab_split(vocab, tp)
    return whole_number(tokens, "tokens") * (rows * whole_number(element_bytes, "element_bytes") + 1 + 8)


B, S, D, V = 2, 8, 16, 96  # 96 token rows split 1, 2, 3, 4 and 8 ways; 8 tokens split 2 and 4 ways


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE)


def _data(seed: int = 0, scale: float = 3.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, S, V, generator=g) * scale
    targets = torch.randint(0, V, (B, S), generator=g)
    return logits, targets


def _reference_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


# -- one process --------------------------------------------------------------------------------------
def test_on_one_rank_the_autograd_function_is_cross_entropy_forward_and_backward():
    logits, targets = _data(seed=2)
    full, mine = logits.clone().requires_grad_(), logits.clone().requires_grad_()
    _reference_loss(full, targets).mean().backward()
    loss = vocab_parallel_cross_entropy(mine, targets, TPGroup(1, 0))  # tp = 1: no collective at all
    loss.mean().backward()
    assert _close(loss, _reference_loss(logits, targets)) and _close(mine.grad, full.grad)


def test_vocab_ranges_tile_the_vocabulary():
    assert [vocab_range(V, 4, i) for i in range(4)] == [(0, 24), (24, 48), (48, 72), (72, 96)]
    assert check_vocab_split(128256, 8) == 16032


def test_a_vocabulary_tp_does_not_divide_is_refused_in_the_learners_terms():
    with pytest.raises(ValueError, match=r"a vocabulary of 50 tokens cannot be split 4 ways: .*12\.5.*128 x tp.*"
                                         r"padded_vocab_size"):
        VocabParallelEmbedding(torch.zeros(50, 8), TPGroup(4, 0))
    with pytest.raises(ValueError, match="a vocabulary of 50 tokens cannot be split 4 ways"):
        check_vocab_split(50, 4)


def test_bad_inputs_are_refused_before_any_communication():
    """A ``TPGroup`` with no ``comm`` raises a RuntimeError at its first collective: a ValueError here
    shows that the check came first."""
    tpg = TPGroup(4, 1)
    logits, targets = _data()
    shard = logits[..., 24:48]
    with pytest.raises(ValueError, match=r"the logits are \(2, 8, 24\) but the targets \(2, 5\)"):
        vocab_parallel_cross_entropy(shard, targets[:, :5], tpg)
    with pytest.raises(ValueError, match=r"target token ids must lie in \[0, 96\).*\[96\]"):
        vocab_parallel_cross_entropy(shard, targets.masked_fill(targets == targets[0, 0], V), tpg)
    with pytest.raises(ValueError, match=r"\[-100\].*ignore_index"):
        vocab_parallel_cross_entropy(shard, targets.masked_fill(targets == targets[0, 0], -100), tpg)
    with pytest.raises(ValueError, match="integer token ids"):
        vocab_parallel_cross_entropy(shard, targets.float(), tpg)
    with pytest.raises(ValueError, match=r"input token ids must lie in \[0, 96\)"):
        VocabParallelEmbedding(torch.zeros(V, D), tpg).local(torch.tensor([[0, 96]]))


def test_the_collectives_by_hand():
    tokens = B * S
    assert vocab_parallel_loss_collectives(tokens, 1) == [] == gathered_logits_collectives(tokens, V, 1)
    assert vocab_parallel_loss_collectives(tokens, 4) == [("all_reduce", 64)] * 3  # 16 tokens x 4 bytes, 3 times
    assert gathered_logits_collectives(tokens, V, 4) == [("all_gather", 16 * 96 * 4)]
    assert vocab_embedding_collectives(tokens, D, 4) == [("all_reduce", 16 * 16 * 4)]
    assert vocab_embedding_collectives(tokens, D, 4, sequence_parallel=True) == [("reduce_scatter", 16 * 16 * 4)]
    # Llama 3's vocabulary, one 8192-token sequence in bf16 at tp 8: 48 KiB against 2 GiB, V / 3 times fewer
    loss = sum(b for _, b in vocab_parallel_loss_collectives(8192, 8, element_bytes=2))
    gathered = sum(b for _, b in gathered_logits_collectives(8192, 128256, 8, element_bytes=2))
    assert (loss, gathered) == (3 * 8192 * 2, 8192 * 128256 * 2) and gathered / loss == 128256 / 3


# -- on real ranks ------------------------------------------------------------------------------------
def _ops(got, stage: str, rank: int) -> list[tuple[str, int]]:
    """(op, buffer bytes) of each collective ``rank`` issued inside its span ``stage``."""
    (span,) = got.spans(stage, rank)
    return [(r.op, r.size_bytes) for r in got.within(span)]


def _lm_ends_on_rank(ctx, tokens, targets, emb_w, head_w):
    """Embedding (vocabulary-parallel), LM head (column-parallel), loss (vocabulary-parallel): forward and
    backward of the mean loss, each stage a span on the rank's timeline."""
    tpg, stage = TPGroup.world(ctx), ctx.timeline.span
    emb, head = VocabParallelEmbedding(emb_w, tpg), ColumnParallelLinear(head_w, None, tpg)
    with stage("embedding"):
        h = emb(tokens)
    with stage("head"):
        logits = head(h)  # (b, s, V/tp); f is the identity forward
    shard = logits.detach().requires_grad_()  # the loss's backward alone, then the rest
    with stage("loss_forward"), SavedBytes(set()) as saved:
        loss = vocab_parallel_cross_entropy(shard, targets, tpg)
    with stage("loss_backward"):
        loss.mean().backward()
    with stage("rest_backward"):
        logits.backward(shard.grad)
    return {"h": h.detach(), "loss": loss.detach(), "grad_logits": shard.grad, "grad_emb": emb.weight.grad,
            "grad_head": head.weight.grad, "loss_saved_bytes": saved.size_bytes}


def _weights(seed: int = 3):
    g = torch.Generator().manual_seed(seed)
    tokens, targets = torch.randint(0, V, (B, S), generator=g), torch.randint(0, V, (B, S), generator=g)
    return tokens, targets, torch.randn(V, D, generator=g), torch.randn(V, D, generator=g) / D ** 0.5


def test_the_vocabulary_parallel_ends_equal_one_process(pool):
    tokens, targets, emb_w, head_w = _weights()
    ref_emb, ref_head = emb_w.clone().requires_grad_(), head_w.clone().requires_grad_()
    ref_h = F.embedding(tokens, ref_emb)
    ref_logits = F.linear(ref_h, ref_head)
    ref_logits.retain_grad()
    ref_loss = _reference_loss(ref_logits, targets)
    ref_loss.mean().backward()

    tp = pool.world_size
    got = on_ranks(pool, _lm_ends_on_rank, tokens, targets, emb_w, head_w)
    runs = got.each()
    tokens_bytes = B * S * 4
    for r, run in enumerate(runs):
        assert torch.equal(run["h"], ref_h.detach())  # one non-zero partial per token: exact
        assert _close(run["loss"], ref_loss.detach())
        assert _close(run["grad_emb"], ref_emb.grad.chunk(tp)[r]), r  # this rank's rows of each gradient
        assert _close(run["grad_head"], ref_head.grad.chunk(tp)[r]), r
        # the comm log: g's one all-reduce; three all-reduces of one float per token; nothing back but f's
        assert _ops(got, "embedding", r) == vocab_embedding_collectives(B * S, D, tp) == [
            ("all_reduce", tokens_bytes * D)]
        assert _ops(got, "head", r) == []
        assert _ops(got, "loss_forward", r) == vocab_parallel_loss_collectives(B * S, tp) == [
            ("all_reduce", tokens_bytes)] * 3
        assert _ops(got, "loss_backward", r) == []
        assert _ops(got, "rest_backward", r) == [("all_reduce", tokens_bytes * D)]  # the head's f: dL/dh summed
        # kept for the backward: this rank's softmax (b, s, V/tp), and per token a flag and an index
        assert run["loss_saved_bytes"] == vocab_parallel_loss_saved_bytes(B * S, V, tp) == B * S * (V // tp * 4 + 9)
    assert _close(torch.cat([run["grad_logits"] for run in runs], dim=-1), ref_logits.grad)
    # never the logits: 3 x 16 x 4 bytes, not the 16 x 96 x 4 a gather would move: V / 3 = 32 times fewer
    moved = sum(b for _, b in _ops(got, "loss_forward", 0))
    assert sum(b for _, b in gathered_logits_collectives(B * S, V, tp)) / moved == V / 3


def _sp_embedding_on_rank(ctx, tokens, emb_w):
    tpg = TPGroup.world(ctx)
    return ScatterToSequence.apply(VocabParallelEmbedding(emb_w, tpg).local(tokens), tpg)


def test_with_sequence_parallelism_each_rank_keeps_its_tokens_exactly(pool):
    tokens, _, emb_w, _ = _weights(seed=4)
    tp, ref = pool.world_size, F.embedding(tokens, emb_w)
    got = on_ranks(pool, _sp_embedding_on_rank, tokens, emb_w)
    for r, out in enumerate(got.each()):
        assert torch.equal(out, ref.chunk(tp, dim=1)[r])  # (b, s/tp, d): my run of tokens
        assert [(c.op, c.size_bytes) for c in got.records(rank=r)] == vocab_embedding_collectives(
            B * S, D, tp, sequence_parallel=True)


def _loss_on_rank(ctx, logits, targets):
    tpg = TPGroup.world(ctx)
    return vocab_parallel_cross_entropy(logits.chunk(ctx.world_size, -1)[ctx.rank], targets, tpg)


def test_the_loss_from_vocabulary_slices_equals_cross_entropy(pool):
    logits, targets = _data()
    for loss in pool.run(_loss_on_rank, logits, targets):
        assert _close(loss, _reference_loss(logits, targets))


def test_the_max_over_every_rank_keeps_huge_logits_finite(pool2):
    """A rank's own max (or the sum of the ranks' maxes) would leave exp(z - m) overflowing or all zero."""
    logits, targets = _data(seed=5, scale=1e4)  # exp(1e4) overflows float32; exp(z - max) <= 1 does not
    for loss in pool2.run(_loss_on_rank, logits, targets):
        assert torch.isfinite(loss).all() and _close(loss, _reference_loss(logits, targets))


def test_bad_targets_on_the_ranks_are_an_error_not_a_hang(pool2):
    logits, targets = _data()
    with pytest.raises(RankError, match=r"target token ids must lie in \[0, 96\)"):
        pool2.run(_loss_on_rank, logits, targets + V)


def _torch_loss_parallel_on_rank(ctx, logits, targets):
    """PyTorch's own vocabulary-parallel loss: ``F.cross_entropy`` on logits sharded along the vocabulary
    (a ``DTensor`` placed ``Shard(-1)``) inside ``loss_parallel()``."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (ctx.world_size,))
    shard = logits.chunk(ctx.world_size, -1)[ctx.rank].clone().requires_grad_()
    with loss_parallel():
        loss = F.cross_entropy(DTensor.from_local(shard, mesh, [Shard(2)]).flatten(0, 1), targets.flatten(),
                               reduction="none")
        loss.mean().backward()
    return loss.full_tensor().view(targets.shape), shard.grad


def _ours_on_rank(ctx, logits, targets):
    shard = logits.chunk(ctx.world_size, -1)[ctx.rank].clone().requires_grad_()
    loss = vocab_parallel_cross_entropy(shard, targets, TPGroup.world(ctx))
    loss.mean().backward()
    return loss.detach(), shard.grad


def test_peer_check_pytorch_loss_parallel_agrees(pool2):
    logits, targets = _data(seed=6)
    theirs = pool2.run(_torch_loss_parallel_on_rank, logits, targets)
    for (loss, grad), (their_loss, their_grad) in zip(pool2.run(_ours_on_rank, logits, targets), theirs):
        assert _close(loss, their_loss) and _close(grad, their_grad)
