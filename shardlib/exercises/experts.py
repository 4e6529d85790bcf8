"""Graders for the expert-parallel exercises: a top-k router, and the dispatch plan of one home rank.

References: ``core.experts.routing.route`` (top-k with gates renormalised over the chosen experts, as in Mixtral,
Jiang et al. 2024) and ``core.experts.placement.dispatch_plan`` (GShard's placement, Lepikhin et al. 2020: expert
``e`` on rank ``e // (n_experts / ep)``).
"""

from __future__ import annotations

from collections import Counter

import torch

from shardlib.core.experts.dispatch import make_moe_weights
from shardlib.core.experts.placement import ExpertPlacement, dispatch_plan
from shardlib.core.experts.routing import MoEConfig, route
from shardlib.exercises.result import Collector, ExerciseResult, call, check_callable
from shardlib.lab.experts.reference import make_tokens

ROUTER_CASES = ((16, 8, 2), (16, 8, 1), (10, 4, 3))  # (tokens, experts, k)
D_MODEL = 16


def _router_case(n_tokens: int, n_experts: int, k: int, seed: int):
    cfg = MoEConfig(n_experts=n_experts, k=k, d_model=D_MODEL, d_ff=8)
    x = make_tokens(n_tokens, D_MODEL, seed=seed)  # (T, d_model)
    router = make_moe_weights(cfg, seed=seed).router  # (E, d_model)
    return cfg, x, router


def _by_expert(experts: torch.Tensor, gates: torch.Tensor) -> list[dict[int, float]]:
    return [dict(zip(e.tolist(), g.tolist())) for e, g in zip(experts, gates)]


def _gate_hint(t: int, mine: dict[int, float], routing) -> str:
    total = sum(mine.values())
    probs = routing.probs[t]
    logits = routing.logits[t]
    if all(abs(g - float(probs[e])) < 1e-5 for e, g in mine.items()):
        return (f"they are the softmax over all experts, read at the chosen ones, and sum to {total:.3f}: "
                f"renormalise, a softmax over the k chosen logits only, so each token's gates sum to 1")
    if all(abs(g - float(logits[e])) < 1e-5 for e, g in mine.items()):
        return "they are the raw logits: take a softmax over the k chosen logits"
    return f"they sum to {total:.3f}; a softmax over the k chosen logits sums to 1"


def grade_top_k_router(router_fn) -> ExerciseResult:
    """Grade a learner's ``top_k_router(x, router, k) -> (experts, gates)``: ``x`` is ``(T, d_model)``,
    ``router`` is ``(n_experts, d_model)``; ``experts`` ``(T, k)`` holds each token's ``k`` highest-scoring
    experts (logits ``x @ router.T``), ``gates`` ``(T, k)`` a softmax over those ``k`` logits. The order of
    the ``k`` within a token is free. Checked against ``experts.route``."""
    check_callable(router_fn, "top_k_router")
    got = Collector("top-k router", "(tokens, experts, k) = " + ", ".join(map(str, ROUTER_CASES)))
    for seed, (n_tokens, n_experts, k) in enumerate(ROUTER_CASES):
        cfg, x, router = _router_case(n_tokens, n_experts, k, seed)
        where = f"{n_tokens} tokens, {n_experts} experts, k = {k}"
        answer = call(got, where, router_fn, x.clone(), router.clone(), k)
        if got.not_written:
            return got.result()
        if answer is None:
            continue
        ref = route(x, router, cfg)
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            got.fail(f"{where}: return a pair (experts, gates), got {type(answer).__name__}")
            continue
        experts, gates = answer
        if not isinstance(experts, torch.Tensor) or not isinstance(gates, torch.Tensor):
            got.fail(f"{where}: experts and gates must be tensors")
            continue
        if experts.shape != (n_tokens, k) or gates.shape != (n_tokens, k):
            got.fail(f"{where}: experts and gates must both be ({n_tokens}, {k}), one row per token; got "
                     f"{tuple(experts.shape)} and {tuple(gates.shape)}"
                     + (" (transposed?)" if experts.shape == (k, n_tokens) else ""))
            continue
        chosen, wanted = _by_expert(experts.long(), gates.float()), _by_expert(ref.experts, ref.gates)
        wrong = [t for t in range(n_tokens) if set(chosen[t]) != set(wanted[t])]
        if wrong:
            t = wrong[0]
            lowest = set(ref.preference[t, -k:].tolist())
            hint = (" (those are its lowest scores: take the largest)" if set(chosen[t]) == lowest and k < n_experts
                    else " (experts are picked by the logits x @ router.T, highest first)")
            got.fail(f"{where}: token {t} went to experts {sorted(chosen[t])}, its {k} highest-scoring experts are "
                     f"{sorted(wanted[t])}{hint}; {len(wrong)} of {n_tokens} tokens differ")
            continue
        bad = [t for t in range(n_tokens) if any(abs(chosen[t][e] - wanted[t][e]) > 1e-5 for e in wanted[t])]
        if bad:
            t = bad[0]
            got.fail(f"{where}: token {t}'s gates are {[round(chosen[t][e], 4) for e in sorted(chosen[t])]} "
                     f"for experts "
                     f"{sorted(chosen[t])}, expected {[round(wanted[t][e], 4) for e in sorted(wanted[t])]}: "
                     f"{_gate_hint(t, chosen[t], ref)}")
    return got.result("every token's experts and renormalised gates match the reference router")


# -- the dispatch plan ---------------------------------------------------------------------------------
DISPATCH_CASES = ((12, 8, 2, 2, 0.0), (12, 8, 2, 4, 0.0), (12, 8, 2, 8, 0.0), (9, 8, 1, 4, 0.0),
                  (12, 8, 2, 4, 0.9))  # (tokens, experts, k, ep, skew)


def _slot(s: int, k: int, experts: torch.Tensor) -> str:
    t, c = divmod(s, k)
    return f"slot {s} (token {t}, choice {c}, expert {int(experts[t, c])})"


def grade_dispatch_plan(plan_fn) -> ExerciseResult:
    """Grade a learner's ``plan_dispatch(experts, n_experts, ep) -> (order, rows_to_rank)`` for
    one home rank: ``experts`` ``(T, k)`` are its tokens' chosen experts; expert ``e`` lives on rank
    ``e // (n_experts / ep)``. ``order`` lists every slot id ``t * k + c`` exactly once, grouped
    by destination rank, within a rank by expert, within an expert by slot id; ``rows_to_rank[r]`` counts
    the rows sent to rank ``r``. Checked against ``core.experts.placement.dispatch_plan`` at 2, 4 and 8 ranks."""
    check_callable(plan_fn, "plan_dispatch")
    got = Collector("dispatch plan", "(tokens, experts, k, ep, skew) = " + ", ".join(map(str, DISPATCH_CASES)))
    for seed, (n_tokens, n_experts, k, ep, skew) in enumerate(DISPATCH_CASES):
        cfg = MoEConfig(n_experts=n_experts, k=k, d_model=D_MODEL, d_ff=8, skew=skew)
        experts = route(make_tokens(n_tokens, D_MODEL, seed=seed), make_moe_weights(cfg, seed=seed).router, cfg).experts
        placement = ExpertPlacement(n_experts, ep)
        ref = dispatch_plan(experts, torch.ones_like(experts, dtype=torch.bool), placement)
        where = f"{n_tokens} tokens, k = {k}, {n_experts} experts on {ep} ranks" + (f", skew {skew}" if skew else "")
        answer = call(got, where, plan_fn, experts.clone(), n_experts, ep)
        if got.not_written:
            return got.result()
        if answer is None:
            continue
        if not isinstance(answer, (tuple, list)) or len(answer) != 2:
            got.fail(f"{where}: return a pair (order, rows_to_rank), got {type(answer).__name__}")
            continue
        try:
            order = [int(s) for s in (answer[0].tolist() if isinstance(answer[0], torch.Tensor) else answer[0])]
            rows = [int(r) for r in (answer[1].tolist() if isinstance(answer[1], torch.Tensor) else answer[1])]
        except (TypeError, ValueError):
            got.fail(f"{where}: order must be a sequence of slot ids and rows_to_rank a sequence of {ep} counts")
            continue
        n_slots = n_tokens * k
        seen = Counter(order)
        outside = sorted(s for s in seen if not 0 <= s < n_slots)
        lost = [s for s in range(n_slots) if s not in seen]
        twice = sorted(s for s, c in seen.items() if c > 1)
        if outside:
            got.fail(f"{where}: slot ids run from 0 to {n_slots - 1} (t * k + choice), your plan has {outside[:3]}")
            continue
        if lost or twice:
            parts = []
            if lost:
                parts.append(f"loses {len(lost)} of the {n_slots} slots, first {_slot(lost[0], k, experts)}")
            if twice:
                parts.append(f"sends {len(twice)} slots more than once, first {_slot(twice[0], k, experts)} "
                             f"({seen[twice[0]]} times)")
            got.fail(f"{where}: your plan sends {len(order)} rows for {n_slots} slots: it " + " and ".join(parts)
                     + "; every slot goes exactly once")
            continue
        if len(rows) != ep or sum(rows) != len(order):
            got.fail(f"{where}: rows_to_rank needs {ep} counts adding up to the {len(order)} rows, got {rows}")
            continue
        per_rank = n_experts // ep
        start, misplaced = 0, None
        for r, count in enumerate(rows):
            for s in order[start:start + count]:
                e = int(experts.flatten()[s])
                if e // per_rank != r and misplaced is None:
                    misplaced = (s, r, e)
            start += count
        if misplaced:
            s, r, e = misplaced
            hint = (f": experts sit in contiguous blocks of {per_rank}, so expert {e} is on rank {e} // {per_rank} = "
                    f"{e // per_rank}, not {e} % {ep} = {e % ep}" if e % ep == r
                    else f", but expert {e} lives on rank {e} // {per_rank} = {e // per_rank}")
            got.fail(f"{where}: {_slot(s, k, experts)} is in the block for rank {r}{hint}")
            continue
        if rows != ref.rows_to_rank:
            got.fail(f"{where}: rows_to_rank is {rows}, the slots' experts give {ref.rows_to_rank}")
            continue
        want = ref.order.tolist()
        if order != want:
            i = next(i for i, (a, b) in enumerate(zip(order, want)) if a != b)
            got.fail(f"{where}: the right rows for each rank, in another order; at position {i} you send "
                     f"{_slot(order[i], k, experts)}, the plan sends {_slot(want[i], k, experts)}: within a rank, "
                     f"group rows by expert (ascending), and within an expert keep slot-id order")
    return got.result("every slot is sent once, to the rank of its expert, in the reference order")
