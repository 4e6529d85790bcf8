"""Mixture-of-experts routing in one process: the router, the knob, load statistics, the auxiliary
loss, capacity, dropping and rerouting, and the reference layer.

Exactness: the layer runs every matrix multiply on fixed blocks of rows, so a token's result does not
depend on which other tokens shared the call; outputs that should be the same are compared with
``torch.equal``. The one tolerance (``1e-6``) is against a naive token-by-token loop, whose multiplies
see one row at a time and may round differently.
"""

import math

import pytest
import torch

from shardlib.core.experts.balance import assign, bias_update, capacity, served_gates, switch_aux_loss
from shardlib.core.experts.dispatch import make_moe_weights, run_experts
from shardlib.core.experts.routing import MAX_PREFERENCE_BIAS, MoEConfig, Routing, preference_bias, route
from shardlib.core.model import mlp_reference
from shardlib.facts.models import LLAMA_3_8B, MIXTRAL_8X7B, TOY_MOE
from shardlib.lab.experts.balance import load_stats
from shardlib.lab.experts.drivers import make_tokens, moe_reference, token_groups

CFG = MoEConfig.from_model(TOY_MOE)  # 8 experts, top-2, d_model 64, d_ff 128
WEIGHTS = make_moe_weights(CFG, seed=0)
X = make_tokens(1024, CFG.d_model, seed=1)


def test_configs_come_from_the_model_presets():
    assert (CFG.n_experts, CFG.k, CFG.d_model, CFG.d_ff) == (8, 2, 64, 128)
    mixtral = MoEConfig.from_model(MIXTRAL_8X7B)
    assert (mixtral.n_experts, mixtral.k, mixtral.d_model, mixtral.d_ff) == (8, 2, 4096, 14336)
    assert MoEConfig.from_model(TOY_MOE, k=1).k == 1
    with pytest.raises(ValueError, match="Llama-3-8B is a dense model"):
        MoEConfig.from_model(LLAMA_3_8B)


# -- routing invariants -------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 3, 8])
@pytest.mark.parametrize("skew", [0.0, 0.5, 1.0])
def test_every_token_gets_k_distinct_experts_the_k_best_scoring(k, skew):
    r = route(X, WEIGHTS.router, CFG.but(k=k, skew=skew))
    assert r.experts.shape == (X.shape[0], k)
    assert all(len(set(row)) == k for row in r.experts.tolist())
    assert torch.equal(r.experts, r.preference[:, :k])
    chosen_worst = r.logits.gather(1, r.experts).min(1).values  # (T,)
    others = r.logits.scatter(1, r.experts, float("-inf")).max(1).values  # best expert not chosen
    assert bool((chosen_worst >= others).all())


@pytest.mark.parametrize("k", [1, 2, 4])
def test_renormalised_gates_are_a_softmax_over_the_top_k_logits_and_sum_to_one(k):
    r = route(X, WEIGHTS.router, CFG.but(k=k, gate="softmax-topk"))
    assert torch.allclose(r.gates.sum(1), torch.ones(X.shape[0]), atol=1e-6)
    assert torch.allclose(r.gates, torch.softmax(r.logits.gather(1, r.experts), dim=1), atol=1e-7)
    # the same as the full softmax's probabilities, renormalised over the chosen experts
    chosen = r.probs.gather(1, r.experts)
    assert torch.allclose(r.gates, chosen / chosen.sum(1, keepdim=True), atol=1e-6)
    if k == 1:
        assert bool((r.gates == 1).all())


@pytest.mark.parametrize("k", [1, 2, 8])
def test_gates_without_renormalising_are_the_router_probabilities(k):
    r = route(X, WEIGHTS.router, CFG.but(k=k, gate="softmax-then-topk"))
    assert torch.equal(r.gates, r.probs.gather(1, r.experts))
    sums = r.gates.sum(1)
    if k < CFG.n_experts:
        assert bool((sums < 1).all())
    else:
        assert torch.allclose(sums, torch.ones_like(sums), atol=1e-6)


def test_routing_is_deterministic_under_a_seed():
    a = route(make_tokens(64, 64, seed=5), make_moe_weights(CFG, seed=3).router, CFG)
    b = route(make_tokens(64, 64, seed=5), make_moe_weights(CFG, seed=3).router, CFG)
    c = route(make_tokens(64, 64, seed=6), make_moe_weights(CFG, seed=3).router, CFG)
    assert torch.equal(a.experts, b.experts) and torch.equal(a.gates, b.gates)
    assert not torch.equal(a.experts, c.experts)


# -- the knob -----------------------------------------------------------------------------------------------
def test_the_skew_bonus_by_hand():
    assert torch.equal(preference_bias(CFG), torch.zeros(8))
    # n = 8, skew 0.5: p = 1/8 + 0.5 * 7/8 = 0.5625, bonus log(7 * 0.5625 / 0.4375) = log 9
    bias = preference_bias(CFG.but(skew=0.5, hot_expert=3))
    assert bias[3].item() == pytest.approx(math.log(9)) and bias.count_nonzero() == 1
    # a token with no preference of its own gives the hot expert exactly p
    assert torch.softmax(bias, 0)[3].item() == pytest.approx(0.5625)
    assert preference_bias(CFG.but(skew=1.0))[0].item() == MAX_PREFERENCE_BIAS


def test_the_knob_moves_the_load_from_even_to_one_hot_expert():
    top1 = CFG.but(k=1)
    counts = [torch.bincount(route(X, WEIGHTS.router, top1.but(skew=s, hot_expert=5)).experts.flatten(),
                             minlength=8) for s in (0.0, 0.25, 0.5, 0.75, 1.0)]
    hot = [int(c[5]) for c in counts]
    # raising one expert's logit can only add tokens to it: its load never falls as the skew rises
    assert hot == sorted(hot) and hot[0] < hot[-1]
    assert load_stats(counts[0]).max_over_mean < 1.4  # uniform preferences: sampling noise only
    assert hot[-1] == X.shape[0] and load_stats(counts[-1]).max_over_mean == 8.0
    # with k = 2 at skew 1, every token's first choice is the hot expert; the second is spread
    r = route(X, WEIGHTS.router, CFG.but(skew=1.0, hot_expert=5))
    assert bool((r.experts[:, 0] == 5).all()) and len(set(r.experts[:, 1].tolist())) == 7


# -- load statistics and the auxiliary loss ------------------------------------------------------------
def test_load_statistics_by_hand():
    assert (load_stats([2, 2, 2, 2]).max_over_mean, load_stats([2, 2, 2, 2]).cv) == (1.0, 0.0)
    s = load_stats(torch.tensor([4, 0, 0, 0]))
    assert s.max_over_mean == 4.0 and s.cv == pytest.approx(math.sqrt(3))  # all on one of n: sqrt(n - 1)
    s = load_stats([3, 1])
    assert (s.max_over_mean, s.cv, s.loads) == (1.5, 0.5, (3, 1))
    assert load_stats([0, 0]).max_over_mean == 1.0
    # against the even share of 16 requested slots (4 each), 10 of them served: the busiest took 1.5x
    s = load_stats([6, 2, 2, 0], total=16)
    assert s.max_over_mean == 1.5 and s.cv == pytest.approx(math.sqrt(19 / 4) / 2.5)  # CV around the mean 2.5
    with pytest.raises(ValueError, match="at least one load"):
        load_stats([])


def _routing(experts, probs) -> Routing:
    experts, probs = torch.tensor(experts), torch.tensor(probs)
    logits = probs.log()
    return Routing(logits, probs, torch.sort(logits, dim=1, descending=True, stable=True).indices, experts,
                   torch.ones(experts.shape, dtype=probs.dtype), probs)


def aux_load_balancing_loss(routing: Routing) -> float:
    return float(switch_aux_loss(routing.experts, routing.probs.double()))


def test_the_switch_auxiliary_loss_by_hand():
    balanced = _routing([[0], [1]], [[0.5, 0.5], [0.5, 0.5]])
    assert aux_load_balancing_loss(balanced) == pytest.approx(1.0)
    # both tokens on expert 0 (f = [1, 0]) with mean probabilities [0.75, 0.25]: 2 * 0.75
    leaning = _routing([[0], [0]], [[0.75, 0.25], [0.75, 0.25]])
    assert aux_load_balancing_loss(leaning) == pytest.approx(1.5)
    # everything on one of 4 experts, which takes all the probability: n
    hot = _routing([[0], [0]], [[1.0, 1e-9, 1e-9, 1e-9]] * 2)
    assert aux_load_balancing_loss(hot) == pytest.approx(4.0, rel=1e-6)
    # on real routing it grows with the skew
    losses = [aux_load_balancing_loss(route(X, WEIGHTS.router, CFG.but(skew=s))) for s in (0.0, 0.5, 1.0)]
    assert losses[0] < 1.1 and losses == sorted(losses) and losses[-1] > 3.5


# -- capacity, dropping, rerouting ---------------------------------------------------------------------------
def test_capacity_arithmetic():
    assert capacity(4096, 2, 1.25, 8) == 1280  # 4096 * 2 * 1.25 / 8
    assert capacity(10, 1, 1.0, 3) == 4  # 3.33 rounds up
    assert capacity(8, 2, 1.1, 8) == 3  # 2.2 rounds up
    assert capacity(10, 1, 0.3, 3) == 1  # 1.0000000000000002 in floating point is still 1
    assert capacity(0, 2, 1.0, 8) == 0


@pytest.mark.parametrize("cf", [0, 0.0, -1.0])
def test_a_capacity_factor_at_or_below_zero_is_refused(cf):
    with pytest.raises(ValueError, match=f"capacity_factor must be a positive number, got {cf}"):
        capacity(10, 1, cf, 4)
    with pytest.raises(ValueError, match=f"capacity_factor .*None for no cap.* must be a positive number, got {cf}"):
        MoEConfig(capacity_factor=cf)


def _three_tokens() -> Routing:
    # preferences: t0 likes 1, 0, 2; t1 likes 0, 1, 2; t2 likes 0, 2, 1
    pref = torch.tensor([[1, 0, 2], [0, 1, 2], [0, 2, 1]])
    logits = torch.zeros(3, 3).scatter(1, pref, torch.tensor([[3.0, 2.0, 1.0]] * 3))
    return route_from_logits(logits, k=2)


def route_from_logits(logits, k) -> Routing:
    probs = torch.softmax(logits, 1)
    pref = torch.sort(logits, dim=1, descending=True, stable=True).indices
    return Routing(logits, probs, pref, pref[:, :k], torch.softmax(logits.gather(1, pref[:, :k]), 1), probs)


def test_first_choices_are_served_before_second_choices_and_overflow_is_dropped():
    r = _three_tokens()
    # capacity ceil(3 tokens * 2 * 0.5 / 3 experts) = 1 slot per expert. First choices in token order:
    # t0 -> 1 (fits), t1 -> 0 (fits), t2 -> 0 (full). Then second choices: t0 -> 0 (full), t1 -> 1
    # (full), t2 -> 2 (fits).
    a = assign(r, MoEConfig(n_experts=3, k=2, d_model=4, d_ff=4, capacity_factor=0.5))
    assert a.capacity == 1
    assert a.kept.tolist() == [[True, False], [True, False], [False, True]]
    assert (a.dropped_slots, a.dropped_tokens, a.rerouted_slots) == (3, 0, 0)
    assert a.counts(3).tolist() == [1, 1, 1]


def test_rerouting_sends_overflow_to_the_next_choice_with_room():
    r = _three_tokens()
    # capacity 2. Round 0 keeps t0 -> 1, t1 -> 0, t2 -> 0, t1 -> 1, t2 -> 2 and drops t0's second choice
    # (expert 0 is full); rerouting tries t0's next preference, expert 2, which has room.
    cfg = MoEConfig(n_experts=3, k=2, d_model=4, d_ff=4, capacity_factor=1.0)
    dropped = assign(r, cfg)
    assert dropped.kept.tolist() == [[True, False], [True, True], [True, True]]
    rerouted = assign(r, cfg.but(reroute=True))
    assert rerouted.kept.all() and rerouted.experts.tolist() == [[1, 2], [0, 1], [0, 2]]
    assert rerouted.rerouted.tolist() == [[False, True], [False, False], [False, False]]


def test_a_rerouted_slot_keeps_its_gate_or_is_rescored_by_choice():
    r = _three_tokens()
    cfg = MoEConfig(n_experts=3, k=2, d_model=4, d_ff=4, capacity_factor=1.0, reroute=True)
    a = assign(r, cfg)  # t0's second slot moved from expert 0 to expert 2 (see the test above)
    kept = served_gates(r, a, cfg)
    assert torch.equal(kept, r.gates)  # "keep": the gates the router gave, the expert changed
    rescored = served_gates(r, a, cfg.but(reroute_gate="rescore"))
    want = torch.softmax(r.logits[0, [1, 2]], dim=-1)  # t0 is now served by experts 1 and 2
    assert torch.allclose(rescored[0], want) and torch.equal(rescored[1:], r.gates[1:])  # others untouched
    switch = MoEConfig(n_experts=3, k=2, d_model=4, d_ff=4, capacity_factor=1.0, reroute=True, gate="softmax-then-topk",
                       reroute_gate="rescore")
    assert torch.allclose(served_gates(r, a, switch)[0], r.probs[0, [1, 2]])  # the router's probabilities
    with pytest.raises(ValueError, match="unknown reroute_gate .* 'favourite'; use one of 'keep', 'rescore'"):
        cfg.but(reroute_gate="favourite")


def test_rescoring_changes_only_tokens_with_a_rerouted_slot():
    cfg = CFG.but(skew=0.8, capacity_factor=1.0, reroute=True)
    keep, rescore = moe_reference(X, WEIGHTS, cfg), moe_reference(X, WEIGHTS, cfg.but(reroute_gate="rescore"))
    touched = keep.assignment.rerouted.any(dim=1)
    assert touched.sum() > 0 and torch.equal(keep.output[~touched], rescore.output[~touched])
    assert not torch.allclose(keep.output[touched], rescore.output[touched])


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("cf", [0.5, 1.0, 1.25])
def test_capacity_holds_and_rerouting_keeps_experts_distinct(k, cf):
    cfg = CFG.but(k=k, skew=0.8, capacity_factor=cf)
    r = route(X, WEIGHTS.router, cfg)
    plain, rerouted = assign(r, cfg), assign(r, cfg.but(reroute=True))
    cap = capacity(X.shape[0], k, cf, 8)
    for a in (plain, rerouted):
        assert a.capacity == cap and int(a.counts(8).max()) <= cap
        assert a.counts(8).sum().item() + a.dropped_slots == X.shape[0] * k  # every slot served or dropped
        assert all(len(set(row)) == k for row in a.experts.tolist())
    assert rerouted.rerouted_slots == plain.dropped_slots - rerouted.dropped_slots
    room = 8 * cap  # slots all experts together can take
    assert rerouted.dropped_slots >= X.shape[0] * k - room
    if cf >= 1.0:  # room for every slot somewhere: rerouting keeps almost all of them
        assert rerouted.dropped_slots < plain.dropped_slots
        assert rerouted.dropped_slots <= 0.01 * X.shape[0] * k
    else:  # not enough room for every slot: rerouting fills every expert, and drops the rest
        assert rerouted.dropped_slots == X.shape[0] * k - room <= plain.dropped_slots


def test_groups_each_get_their_own_capacity():
    cfg = CFG.but(skew=1.0, capacity_factor=1.0, k=1)
    r = route(X, WEIGHTS.router, cfg)
    one, four = (moe_reference(X, WEIGHTS, cfg, n_groups).assignment for n_groups in (1, 4))
    assert one.capacity == capacity(1024, 1, 1.0, 8) == 128 and four.capacity == capacity(256, 1, 1.0, 8) == 32
    assert torch.equal(one.kept, assign(r, cfg).kept)
    assert four.counts(8)[0].item() == 4 * 32  # the hot expert fills its capacity in each group
    assert [len(g) for g in token_groups(torch.zeros(10, 1), 4)] == [3, 3, 2, 2]  # contiguous, as tensor_split


# -- the reference layer -----------------------------------------------------------------------------------------
def test_the_reference_layer_against_a_token_by_token_loop():
    cfg = CFG.but(skew=0.3)
    x = X[:40]
    out, routing = moe_reference(x, WEIGHTS, cfg), route(x, WEIGHTS.router, cfg)
    for t in range(x.shape[0]):
        expected = x[t].clone()
        for e, g in zip(routing.experts[t].tolist(), routing.gates[t]):
            expected += g * mlp_reference(x[t:t + 1], WEIGHTS.gate[e], WEIGHTS.up[e], WEIGHTS.down[e])[0]
        assert torch.allclose(out.output[t], expected, atol=1e-6)


def test_an_expert_result_does_not_depend_on_its_batch():
    def expert_2(rows):  # every row to expert 2
        return run_experts(rows, torch.tensor([[rows.shape[0]]]), WEIGHTS.experts([2]))

    rows = X[:300]
    full = expert_2(rows)
    for lo, hi in ((0, 1), (5, 6), (7, 70), (100, 299)):
        assert torch.equal(expert_2(rows[lo:hi]), full[lo:hi])


def test_dropped_tokens_pass_through_the_residual_and_kept_ones_are_unchanged():
    cfg = CFG.but(k=1, skew=0.9)
    uncapped = moe_reference(X, WEIGHTS, cfg)
    capped = moe_reference(X, WEIGHTS, cfg.but(capacity_factor=1.0))
    dropped = ~capped.assignment.kept[:, 0]
    assert capped.assignment.dropped_tokens == int(dropped.sum()) > 0
    assert torch.equal(capped.output[dropped], X[dropped])  # the layer left them as they came
    assert torch.equal(capped.output[~dropped], uncapped.output[~dropped])
    assert not torch.equal(capped.output, uncapped.output)


def test_top_2_tokens_that_lose_one_slot_keep_the_other():
    cfg = CFG.but(skew=0.8)  # at skew 1 the second choice's gate is 0: the hot expert takes all the weight
    capped = moe_reference(X, WEIGHTS, cfg.but(capacity_factor=1.0))
    a = capped.assignment
    half = a.kept.sum(1) == 1  # lost exactly one slot: the hot expert is full
    assert int(half.sum()) > 0 and a.dropped_tokens == 0
    assert not torch.equal(capped.output[half], X[half])


# -- bad input -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(k=0), "k \\(experts per token\\) must be a whole number from 1 to 8, got 0"),
    (dict(k=9), "k \\(experts per token\\) must be a whole number from 1 to 8, got 9"),
    (dict(k=2.0), "got 2.0"),
    (dict(skew=1.5), "skew \\(0: uniform preferences, 1: one hot expert\\) must be a number from 0 to 1, got 1.5"),
    (dict(skew=-0.1), "got -0.1"),
    (dict(hot_expert=8), "hot_expert must be a whole number from 0 to 7, got 8"),
    (dict(gate="top-2"), "unknown gate \\(the router's gate function\\) 'top-2'"),
    (dict(reroute=True), "reroute=True moves token-slots that overflow.*set a capacity_factor too"),
    (dict(n_experts=0), "n_experts must be a whole number of at least 1, got 0"),
])
def test_bad_configs_name_the_numbers(kwargs, words):
    with pytest.raises(ValueError, match=words):
        MoEConfig(**kwargs)


def test_bad_tokens_and_groups_name_the_numbers():
    with pytest.raises(ValueError,
                       match="tokens must be a \\(tokens, d_model\\) tensor with d_model = 64, got \\(5, 32\\)"):
        route(torch.zeros(5, 32), WEIGHTS.router, CFG)
    with pytest.raises(ValueError, match="got \\(2, 5, 64\\)"):
        moe_reference(torch.zeros(2, 5, 64), WEIGHTS, CFG)
    with pytest.raises(ValueError, match=r"the router must be \(n_experts, d_model\) = \(4, 64\), got \(8, 64\)"):
        route(X, WEIGHTS.router, MoEConfig(n_experts=4))
    with pytest.raises(ValueError, match="weights hold 8 experts of width 64, the config says 8 of width 32"):
        moe_reference(X, WEIGHTS, CFG.but(d_model=32))
    with pytest.raises(ValueError, match="3 tokens cannot be split into 4 groups"):
        token_groups(X[:3], 4)
    with pytest.raises(ValueError, match="k \\(experts per token\\) must be a whole number from 1 to 8, got 9"):
        capacity(10, 9, 1.0, 8)


def test_bias_balancing_evens_a_skewed_load_without_touching_the_gates():
    """DeepSeek-V3's bias played over batches: ``route`` chooses with it, ``bias_update`` moves it."""
    cfg = MoEConfig.from_model(TOY_MOE).but(skew=0.75)
    router = make_moe_weights(cfg, seed=0).router
    bias, loads = torch.zeros(cfg.n_experts), []
    for s in range(30):
        r = route(make_tokens(1024, cfg.d_model, seed=s), router, cfg, bias)
        counts = torch.bincount(r.experts.flatten(), minlength=cfg.n_experts)
        loads.append(float(counts.max() / counts.double().mean()))
        bias = bias_update(bias, counts, 0.1)
    assert loads[0] > 3  # skew 0.75: the hot expert takes most first choices
    assert max(loads[-5:]) < 1.3  # the bias has evened the load
    assert int(bias.argmin()) == cfg.hot_expert  # pushed down for the overloaded expert
    # the gates come from the scores without the bias: a softmax over the chosen experts' own logits
    assert torch.equal(r.gates, torch.softmax(r.logits.gather(1, r.experts), dim=-1))
    assert not torch.equal(r.experts, route(make_tokens(1024, cfg.d_model, seed=29), router, cfg).experts)


def test_the_stall_verdict_predicts_the_cpu_ratio_from_the_rows():
    from types import SimpleNamespace

    from shardlib.lab.experts.drivers import stall_verdicts

    def runs(cpu):
        return {1.0: SimpleNamespace(expert_rows=[5000, 3000], expert_cpu_floor_s=cpu)}

    (held,) = stall_verdicts(runs((0.045, 0.030)))
    assert held.predicted == pytest.approx(5 / 3) and held.measured == pytest.approx(1.5) and held.held
    assert "rank 0's expert CPU time over rank 1's" in held.what
    (failed,) = stall_verdicts(runs((0.030, 0.030)))  # equal CPU for 5/3 the rows: not the stall's cause
    assert not failed.held
