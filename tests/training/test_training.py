"""The toy language model in one process: its config's checks, its corpus, its reference, the layout rules,
and the vocabulary-parallel loss at tp = 2, 3, 4, 8 simulated by slicing (one thread per rank)."""

import math
import threading

import pytest
import torch
import torch.nn.functional as F

from shardlib.core.checks import TOLERANCE
from shardlib.core.mesh import Layout
from shardlib.core.tensor_parallel.layers import TPGroup
from shardlib.core.tensor_parallel.vocab import VocabParallelEmbedding, vocab_parallel_cross_entropy
from shardlib.core.training.config import TrainingConfig, init_weights
from shardlib.core.training.corpus import MarkovCorpus
from shardlib.core.training.reference import train_reference
from shardlib.lab.training.drivers import check_training


def test_config_checks_and_batch_accounting():
    c = TrainingConfig()
    assert c.global_batch(2) == c.microbatch * c.m * 2 and c.global_tokens(2) == c.global_batch(2) * c.seq
    assert "2 x 2 x 2 = 8 sequences" in c.batch_text(2)
    with pytest.raises(ValueError, match="lr"):
        TrainingConfig(lr=0)
    with pytest.raises(ValueError, match="KV heads"):
        TrainingConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="dtype"):
        TrainingConfig(dtype="float16")


def test_the_corpus_is_learnable_and_the_reference_learns_it():
    c = TrainingConfig(steps=12)
    corpus = MarkovCorpus(c)
    assert corpus.entropy_nats < 0.5 * corpus.uniform_nats  # the chain has structure to learn
    assert torch.equal(corpus.batch(3, 4), corpus.batch(3, 4))  # seeded per step
    run = train_reference(c)
    assert run.losses[-1] < run.losses[0] - 1.0
    assert set(run.weights) == set(init_weights(c))


@pytest.mark.parametrize("layout, seq, match", [
    (Layout(tp=3, pp=1), 16, "KV heads"),
    (Layout(tp=1, pp=1, cp=3), 16, "sequence of 16 tokens"),
    (Layout(tp=2, pp=1, cp=2), 12, "2 x cp x tp"),
    (Layout(tp=2, pp=1), 15, "sequence parallelism"),
    (Layout(tp=1, pp=5), 16, "5 pipeline stages"),
    (Layout(tp=1, pp=1, ep=2), 16, "dense"),
    (Layout(tp=1, pp=2, dp=2, dp_strategy="zero3"), 16, "ZeRO-3"),
])
def test_bad_layouts_are_refused_in_the_learners_terms(layout, seq, match):
    with pytest.raises(ValueError, match=match):
        check_training(layout, TrainingConfig(n_layers=4, seq=seq))


def test_vocabulary_that_tp_does_not_divide_is_refused():
    with pytest.raises(ValueError, match="60"):
        VocabParallelEmbedding(torch.zeros(60, 4), TPGroup(8, 0))


class _Threads:
    """``tp`` threads standing in for ranks: their all-reduces meet at a barrier."""

    def __init__(self, tp):
        self.tp, self.barrier, self.slots = tp, threading.Barrier(tp), [None] * tp

    def all_reduce(self, t, op="sum", group=None):
        i = int(threading.current_thread().name)
        self.slots[i] = t.clone()
        self.barrier.wait()
        out = torch.stack(self.slots)
        out = out.max(0).values if op == "max" else out.sum(0)
        self.barrier.wait()
        return out


@pytest.mark.parametrize("tp", [2, 3, 4, 8])
def test_vocab_parallel_loss_equals_the_whole_vocabulary_loss(tp):
    vocab, g = 24, torch.Generator().manual_seed(tp)
    logits = torch.randn(2, 5, vocab, generator=g, dtype=torch.float64)
    targets = torch.randint(vocab, (2, 5), generator=g)
    whole = logits.clone().requires_grad_(True)
    expected = F.cross_entropy(whole.flatten(0, 1), targets.flatten(), reduction="none").view(2, 5)
    expected.sum().backward()
    threads, losses, grads = _Threads(tp), [None] * tp, [None] * tp

    def rank(i):
        shard = logits[..., i * vocab // tp:(i + 1) * vocab // tp].clone().requires_grad_(True)
        tpg = TPGroup(tp, i, threads, None)
        losses[i] = vocab_parallel_cross_entropy(shard, targets, tpg)
        losses[i].sum().backward()
        grads[i] = shard.grad

    workers = [threading.Thread(target=rank, args=(i,), name=str(i)) for i in range(tp)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    for i in range(tp):
        torch.testing.assert_close(losses[i], expected, rtol=TOLERANCE, atol=TOLERANCE)
    torch.testing.assert_close(torch.cat(grads, -1), whole.grad, rtol=TOLERANCE, atol=TOLERANCE)
    assert math.isclose(float(expected.detach().mean()), float(losses[0].detach().mean()), rel_tol=1e-12)


def test_the_written_out_adamw_is_torchs_bit_for_bit():
    import torch

    from shardlib.core.adamw import AdamW

    g = torch.Generator().manual_seed(0)
    mine = torch.randn(7, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    theirs = mine.detach().clone().requires_grad_(True)
    ours, torchs = AdamW([mine], lr=1e-2, weight_decay=0.01), torch.optim.AdamW([theirs], lr=1e-2, weight_decay=0.01,
                                                                              foreach=False)
    for _ in range(4):
        grad = torch.randn(7, 5, generator=g, dtype=torch.float64)
        mine.grad, theirs.grad = grad.clone(), grad.clone()
        ours.step()
        torchs.step()
    assert torch.equal(mine, theirs)
    assert sorted(ours.state[mine]) == ["exp_avg", "exp_avg_sq"]
