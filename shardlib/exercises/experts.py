"""Graders for the expert-parallel exercises: a top-k router, one home rank's dispatch plan, and the
auxiliary-loss-free bias on ranks. References: ``core.experts.routing.route`` (Mixtral's top-k, Jiang et al.
2024; DeepSeek-V3's sigmoid gate and selection bias, arXiv:2412.19437, section 2.1.2),
``core.experts.placement.dispatch_plan`` (GShard, Lepikhin et al. 2020: expert ``e`` on rank
``e // (n_experts / ep)``) and ``core.experts.balance.bias_update`` (``bias + rate * sign(mean load - load)``).
"""

from __future__ import annotations

from collections import Counter

import torch

from shardlib.core.experts.balance import bias_update
from shardlib.core.experts.dispatch import make_moe_weights
from shardlib.core.experts.placement import ExpertPlacement, dispatch_plan
from shardlib.core.experts.routing import MoEConfig, route
from shardlib.core.toy import generator
from shardlib.exercises import result as grading
from shardlib.exercises.result import Collector, ExerciseResult, check_callable
from shardlib.lab.experts.drivers import make_tokens

ROUTER_CASES = ((16, 8, 2), (16, 8, 1), (10, 4, 3))  # (tokens, experts, k)
D_MODEL = 16


def _routed(cfg: MoEConfig, n_tokens: int, seed: int):
    """Tokens ``(T, d_model)``, a router ``(E, d_model)`` and the library's routing of them."""
    x, router = make_tokens(n_tokens, D_MODEL, seed=seed), make_moe_weights(cfg, seed=seed).router
    return x, router, route(x, router, cfg)


def by_expert(experts: torch.Tensor, gates: torch.Tensor) -> list[dict[int, float]]:
    """Per token, its chosen experts and their gates: ``{expert: gate}``, whatever order they came in."""
    return [dict(zip(e.tolist(), g.tolist())) for e, g in zip(experts, gates)]


def _softmax_gate_hint(t: int, mine: dict[int, float], routing) -> str:
    total = sum(mine.values())
    return grading.first_match(mine, [
        (routing.probs[t], f"they are the softmax over all experts, read at the chosen ones, and sum to {total:.3f}: "
                           f"renormalise, a softmax over the k chosen logits only, so each token's gates sum to 1"),
        (routing.logits[t], "they are the raw logits: take a softmax over the k chosen logits"),
    ], lambda gates, want: all(abs(g - float(want[e])) < 1e-5 for e, g in gates.items())) or (
        f"they sum to {total:.3f}; a softmax over the k chosen logits sums to 1")


@grading.checks(experts=2, gates=1)
def grade_top_k_router(router_fn) -> ExerciseResult:
    """Grade a learner's ``top_k_router(x, router, k) -> (experts, gates)``: ``x`` is ``(T, d_model)``,
    ``router`` ``(n_experts, d_model)``; ``experts`` ``(T, k)``, each token's ``k`` highest-scoring experts
    (logits ``x @ router.T``) in any order, ``gates`` ``(T, k)`` a softmax over those. Against ``route``."""
    check_callable(router_fn, "top_k_router")
    got = Collector("top-k router", f"(tokens, experts, k) = {', '.join(map(str, ROUTER_CASES))}",
                    grade_top_k_router.checks)
    for seed, (n_tokens, n_experts, k) in enumerate(ROUTER_CASES):
        x, router, ref = _routed(MoEConfig(n_experts=n_experts, k=k, d_model=D_MODEL, d_ff=8), n_tokens, seed)
        where = f"{n_tokens} tokens, {n_experts} experts, k = {k}"
        answer = grading.call(got, where, router_fn, x.clone(), router.clone(), k)
        if answer is None:
            continue
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            got.fail(f"{where}: return a pair (experts, gates), got {type(answer).__name__}")
            continue
        experts, gates = answer
        kind, t = _routing_problem(where, experts, gates, ref.experts, ref.gates, 1e-5)
        if kind == "experts":
            chosen, wanted = set(experts[t].tolist()), set(ref.experts[t].tolist())
            hint = (" (those are its lowest scores: take the largest)"
                    if chosen == set(ref.preference[t, -k:].tolist()) and k < n_experts
                    else " (experts are picked by the logits x @ router.T, highest first)")
            got.fail(f"{where}: token {t} went to experts {sorted(chosen)}, its {k} highest-scoring experts are "
                     f"{sorted(wanted)}{hint}")
        elif kind == "gates":
            mine, wanted = by_expert(experts, gates)[t], by_expert(ref.experts, ref.gates)[t]
            got.fail(f"{where}: token {t}'s gates are {[round(mine[e], 4) for e in sorted(mine)]} for experts "
                     f"{sorted(mine)}, expected {[round(wanted[e], 4) for e in sorted(wanted)]}: "
                     f"{_softmax_gate_hint(t, mine, ref)}", "gates")
        elif kind:
            got.fail(kind)
    return got.result("every token's experts and renormalised gates match the reference router")


# -- the dispatch plan ---------------------------------------------------------------------------------
DISPATCH_CASES = ((12, 8, 2, 2, 0.0), (12, 8, 2, 4, 0.0), (12, 8, 2, 8, 0.0), (9, 8, 1, 4, 0.0),
                  (12, 8, 2, 4, 0.9))  # (tokens, experts, k, ep, skew)


def _slot(s: int, k: int, experts: torch.Tensor) -> str:
    t, c = divmod(s, k)
    return f"slot {s} (token {t}, choice {c}, expert {int(experts[t, c])})"


def _plan_problem(order: list[int], rows: list[int], experts: torch.Tensor, placement: ExpertPlacement) -> str:
    """What is wrong with the learner's ``(order, rows_to_rank)``, or ``""``."""
    k, ep, per_rank = experts.shape[1], placement.ep, placement.per_rank
    n_slots, seen = experts.numel(), Counter(order)
    outside = sorted(s for s in seen if not 0 <= s < n_slots)
    if outside:
        return f"slot ids run from 0 to {n_slots - 1} (t * k + choice), your plan has {outside[:3]}"
    lost, twice = [s for s in range(n_slots) if s not in seen], sorted(s for s, c in seen.items() if c > 1)
    parts = ([f"loses {len(lost)} of the {n_slots} slots, first {_slot(lost[0], k, experts)}"] if lost else []) + (
        [f"sends {len(twice)} slots more than once, first {_slot(twice[0], k, experts)} ({seen[twice[0]]} times)"]
        if twice else [])
    if parts:
        return (f"your plan sends {len(order)} rows for {n_slots} slots: it " + " and ".join(parts)
                + "; every slot goes exactly once")
    if len(rows) != ep or sum(rows) != len(order):
        return f"rows_to_rank needs {ep} counts adding up to the {len(order)} rows, got {rows}"
    block_of = [r for r, count in enumerate(rows) for _ in range(count)]  # the rank each position goes to
    for s, r in zip(order, block_of):
        e = int(experts.flatten()[s])
        if placement.owner(e) != r:
            return f"{_slot(s, k, experts)} is in the block for rank {r}" + (
                f": experts sit in contiguous blocks of {per_rank}, so expert {e} is on rank {e} // {per_rank} = "
                f"{placement.owner(e)}, not {e} % {ep} = {e % ep}" if e % ep == r
                else f", but expert {e} lives on rank {e} // {per_rank} = {placement.owner(e)}")
    return ""


@grading.checks(destinations=2, order=1)
def grade_dispatch_plan(plan_fn) -> ExerciseResult:
    """Grade a learner's ``plan_dispatch(experts, n_experts, ep) -> (order, rows_to_rank)`` for
    one home rank: ``experts`` ``(T, k)`` are its tokens' chosen experts; expert ``e`` lives on rank
    ``e // (n_experts / ep)``. ``order`` lists every slot id ``t * k + c`` exactly once, grouped
    by destination rank, within a rank by expert, within an expert by slot id; ``rows_to_rank[r]`` counts
    the rows sent to rank ``r``. Checked against ``core.experts.placement.dispatch_plan`` at 2, 4 and 8 ranks."""
    check_callable(plan_fn, "plan_dispatch")
    got = Collector("dispatch plan", "(tokens, experts, k, ep, skew) = " + ", ".join(map(str, DISPATCH_CASES)),
                    grade_dispatch_plan.checks)
    for seed, (n_tokens, n_experts, k, ep, skew) in enumerate(DISPATCH_CASES):
        cfg = MoEConfig(n_experts=n_experts, k=k, d_model=D_MODEL, d_ff=8, skew=skew)
        experts = _routed(cfg, n_tokens, seed)[2].experts  # (T, k)
        placement = ExpertPlacement(n_experts, ep)
        ref = dispatch_plan(experts, torch.ones_like(experts, dtype=torch.bool), placement)
        where = f"{n_tokens} tokens, k = {k}, {n_experts} experts on {ep} ranks" + (f", skew {skew}" if skew else "")
        answer = grading.call(got, where, plan_fn, experts.clone(), n_experts, ep)
        if answer is None:
            continue
        try:
            order, rows = ([int(v) for v in (a.tolist() if isinstance(a, torch.Tensor) else a)] for a in answer)
        except (TypeError, ValueError):
            got.fail(f"{where}: return a pair (order, rows_to_rank): a sequence of slot ids and {ep} counts, got "
                     f"{answer!r:.80}")
            continue
        want = ref.order.tolist()
        problem, check = _plan_problem(order, rows, experts, placement), None
        if not problem and rows != ref.rows_to_rank:
            problem = f"rows_to_rank is {rows}, the slots' experts give {ref.rows_to_rank}"
        if not problem and order != want:
            i = next(i for i, (a, b) in enumerate(zip(order, want)) if a != b)
            problem = (f"the right rows for each rank, in another order; at position {i} you send "
                       f"{_slot(order[i], k, experts)}, the plan sends {_slot(want[i], k, experts)}: within a rank, "
                       f"group rows by expert (ascending), and within an expert keep slot-id order")
            check = "order"
        if problem:
            got.fail(f"{where}: {problem}", check)
    return got.result("every slot is sent once, to the rank of its expert, in the reference order")


# -- the auxiliary-loss-free bias on ranks (DeepSeek-V3) ---------------------------------------------------
N_EXPERTS, K, TOKENS_PER_RANK, STEPS, RATE = 8, 2, 12, 3, 0.05
ATOL = 1e-9
# DeepSeek-V3's gate over logits handed in as tokens through an identity router: affinities sigmoid(logits)
CHOICE = MoEConfig(n_experts=N_EXPERTS, k=K, d_model=N_EXPERTS, d_ff=8, gate="sigmoid-topk")


def bias_exercise_inputs(world_size: int, steps: int = STEPS) -> dict:
    """Scores for ``steps`` steps of ``TOKENS_PER_RANK`` tokens per rank (rank ``r``'s tokens lean towards
    expert ``r``, so one rank's counts are not the whole step's), and the library's bias before each step,
    starting from a bias that is not zero (so that using it in the gates shows at once)."""
    g = generator(world_size)
    logits = torch.randn(steps, world_size * TOKENS_PER_RANK, N_EXPERTS, generator=g, dtype=torch.float64)
    for r in range(world_size):
        logits[:, r * TOKENS_PER_RANK:(r + 1) * TOKENS_PER_RANK, r % N_EXPERTS] += 1.5
    bias = 0.2 * torch.sin(torch.arange(N_EXPERTS, dtype=torch.float64) + world_size)
    biases, answers = [], []
    for s in range(steps):
        routing = route(logits[s], torch.eye(N_EXPERTS, dtype=torch.float64), CHOICE, bias)  # the library's choice
        counts = torch.bincount(routing.experts.flatten(), minlength=N_EXPERTS)
        biases.append(bias)
        answers.append((routing.experts, routing.gates, counts))
        bias = bias_update(bias, counts, RATE)
    return {"scores": torch.sigmoid(logits), "biases": biases, "answers": answers, "after": [*biases[1:], bias]}


def _run_learner(ctx, fn, scores, biases, k, rate):
    """Each rank: the learner's function on its tokens, once per step, from the library's bias."""
    mine = slice(ctx.rank * TOKENS_PER_RANK, (ctx.rank + 1) * TOKENS_PER_RANK)
    return [fn(ctx, scores[s, mine].clone(), biases[s].clone(), k, rate) for s in range(len(biases))]


def _routing_problem(where: str, experts, gates, want_experts, want_gates, atol: float) -> tuple[str, int]:
    """``(what is wrong, token)``: a shape, the first token sent to other experts (``"experts"``), the first
    with other gates (``"gates"``), or ``("", -1)`` when both match (the order within a token is free)."""
    t_, k_ = want_experts.shape
    if not (isinstance(experts, torch.Tensor) and isinstance(gates, torch.Tensor)):
        return f"{where}: experts and gates must be tensors", -1
    if experts.shape != (t_, k_) or gates.shape != (t_, k_):
        return (f"{where}: experts and gates must both be ({t_}, {k_}), one row per token; got "
                f"{tuple(experts.shape)} and {tuple(gates.shape)}"
                + (" (transposed?)" if experts.shape == (k_, t_) else "")), -1
    mine, wanted = by_expert(experts.long(), gates.double()), by_expert(want_experts, want_gates.double())
    for kind, differs in (("experts", lambda a, b: set(a) != set(b)),
                          ("gates", lambda a, b: any(abs(a[e] - b[e]) > atol for e in b))):
        t = next((t for t, (a, b) in enumerate(zip(mine, wanted)) if differs(a, b)), -1)
        if t >= 0:
            return kind, t
    return "", -1


def _choice_hint(experts, scores, want) -> str:
    plain = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :K]
    mine, plain_sets, want_sets = ([set(row) for row in t.tolist()] for t in (experts, plain, want))
    if mine == plain_sets and plain_sets != want_sets:
        return ("you chose by the scores alone: the bias is there to choose, so take the top-k of scores + bias "
                "(it is what moves tokens off a busy expert)")
    t = next(i for i, (a, b) in enumerate(zip(mine, want_sets)) if a != b)
    return f"token {t}: you chose experts {sorted(mine[t])}, the top-{K} of scores + bias is {sorted(want_sets[t])}"


def _biased_gate_hint(experts, gates, scores, bias) -> str:
    """The gates' likely mistake; each candidate is gathered in the learner's order of experts."""
    biased = (scores + bias).gather(1, experts)  # (T, K)
    return grading.first_match(gates.double(), [
        (biased / biased.sum(dim=-1, keepdim=True), "your gates use the bias: the bias only chooses the experts; "
                                                    "weigh them by their scores without it, normalised over the "
                                                    "k chosen"),
        (scores.gather(1, experts), "your gates are the raw scores: normalise them over the k chosen, so each "
                                    "token's gates sum to 1"),
        (biased, "your gates are the scores plus the bias, not normalised: leave the bias out of the gates and "
                 "normalise the chosen scores to sum to 1"),
    ], lambda a, b: grading.close(a, b, ATOL)) or ("each token's gates are its chosen experts' scores (without "
                                                   "the bias) divided by their sum")


def _bias_hint(new_bias, bias, local_counts, counts) -> str:
    """The update's likely mistake, each candidate made with the library's ``bias_update``."""
    summed, local = bias_update(bias, counts, RATE), bias_update(bias, local_counts, RATE)
    return grading.first_match(new_bias.double(), [
        (2 * bias - summed, "the sign is flipped: an expert that took more than the mean load must get a lower "
                            "bias, bias + rate * sign(mean load - load), so that fewer tokens choose it next step"),
        (local, "the counts were not summed over the ranks: this rank's own load moved its bias, so the ranks' "
                "biases drift apart; sum the counts with ctx.comm.all_reduce before the update"),
        (2 * bias - local, "the counts were not summed over the ranks, and the sign is flipped: sum them with "
                           "ctx.comm.all_reduce, then lower the bias of the experts above the mean load"),
        (bias + RATE * (counts.double().mean() - counts.double()), "the update uses the load difference itself: "
                                                                   "DeepSeek-V3 moves each bias by a fixed step, "
                                                                   "rate * sign(mean load - load), whatever the "
                                                                   "size of the difference"),
    ], lambda a, b: grading.close(a, b, ATOL)) or ("new_bias must be bias + rate * sign(mean load - load), with "
                                                   "the loads counted over every rank")


@grading.checks(experts=1, gates=1, bias=2)
def grade_aux_free_bias(route_fn, *pools) -> ExerciseResult:
    """Grade a learner's ``aux_free_route(ctx, scores, bias, k, rate) -> (experts, gates, new_bias)`` on each
    warm ``Ranks`` pool given (2 and 4 ranks in the notebook), for ``STEPS`` steps each, every step from the
    library's bias: experts by ``scores + bias``, gates the chosen scores normalised (the bias never weighs),
    and ``bias + rate * sign(mean load - load)`` on the loads of every rank (``ctx.comm.all_reduce``)."""
    check_callable(route_fn, "aux_free_route")
    got = Collector("auxiliary-loss-free bias on ranks",
                    grading.need_pools(pools, "grade_aux_free_bias") + f", {STEPS} steps each",
                    grade_aux_free_bias.checks)
    alone = bias_exercise_inputs(1, 1)
    if not grading.written(got, route_fn, alone["scores"][0], alone["biases"][0], K, RATE):
        return got.result()
    inputs = {n: bias_exercise_inputs(n) for n in {pool.world_size for pool in pools}}
    for pool, _, ran in grading.runs(got, pools, _run_learner, lambda pool: (
            route_fn, inputs[pool.world_size]["scores"], inputs[pool.world_size]["biases"], K, RATE)):
        problems = [p for s in range(STEPS) for r in range(pool.world_size)
                    if (p := _step_problem(inputs[pool.world_size], s, r, ran.values[r][s]))[1]]
        if problems:
            got.fail(f"{pool.world_size} ranks, {problems[0][1]}", problems[0][0])
            got.failed_checks.update(check for check, _ in problems)  # a later step may break an earlier property
    return got.result("every rank chose by scores + bias, weighed by the scores alone (normalised), and moved "
                      "the bias by rate * sign(mean load - load) on the loads of every rank, at every step")


def _step_problem(inputs: dict, s: int, r: int, out) -> tuple[str, str]:
    """``(the property it breaks, what is wrong)`` with rank ``r``'s answer at step ``s``, or ``("", "")``."""
    where = f"step {s + 1}, rank {r}"
    experts_all, gates_all, counts = inputs["answers"][s]
    bias, mine = inputs["biases"][s], slice(r * TOKENS_PER_RANK, (r + 1) * TOKENS_PER_RANK)
    if not (isinstance(out, tuple) and len(out) == 3):
        return "experts", f"{where}: return three things, (experts, gates, new_bias); got {type(out).__name__}"
    experts, gates, new_bias = out
    kind, _ = _routing_problem(where, experts, gates, experts_all[mine], gates_all[mine], ATOL)
    if kind == "experts":
        return "experts", f"{where}: {_choice_hint(experts.long(), inputs['scores'][s, mine], experts_all[mine])}"
    if kind == "gates":
        return "gates", f"{where}: {_biased_gate_hint(experts.long(), gates, inputs['scores'][s, mine], bias)}"
    if kind:
        return "experts", kind
    if not (isinstance(new_bias, torch.Tensor) and new_bias.shape == bias.shape):
        return "bias", f"{where}: new_bias must be a ({N_EXPERTS},) tensor, one bias per expert"
    if not grading.close(new_bias.double(), inputs["after"][s], ATOL):
        local = torch.bincount(experts_all[mine].flatten(), minlength=N_EXPERTS)
        return "bias", f"{where}: {_bias_hint(new_bias, bias, local, counts)}"
    return "", ""
