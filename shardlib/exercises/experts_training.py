"""Grader for the auxiliary-loss-free balancing exercise (DeepSeek-V3, 2024, arXiv:2412.19437, section 2.1.2).

The learner writes a rank function ``aux_free_route(ctx, scores, bias, k, rate) -> (experts, gates,
new_bias)``: ``scores`` ``(T_r, n_experts)`` are this rank's tokens' sigmoid affinities, ``bias``
``(n_experts,)`` the balancing bias (the same on every rank). It chooses each token's ``k`` experts by
``scores + bias``, weighs them by the chosen *scores* normalised to sum to 1 (the bias never weighs),
counts the token-slots per expert **over every rank** (``ctx.comm.all_reduce``) and returns ``bias +
rate * sign(mean load - load)``. The grader runs it on ranks for a few steps, each step from the
library's bias (``core.experts.balance.bias_update``), and names the mistakes it finds: the bias left out of
the choice, the bias used in the gates, gates not normalised, the sign flipped, the counts not summed
over the ranks, the load difference used without its sign.
"""

from __future__ import annotations

import torch

from shardlib.core.experts.balance import bias_update
from shardlib.core.toy import generator
from shardlib.exercises.result import Collector, ExerciseResult, call, check_callable
from shardlib.lab.harness import on_ranks
from shardlib.runtime.errors import RankError, RankTimeoutError

N_EXPERTS, K, TOKENS_PER_RANK, STEPS, RATE = 8, 2, 12, 3, 0.05
ATOL = 1e-9


def bias_exercise_inputs(world_size: int, steps: int = STEPS) -> dict:
    """Scores for ``steps`` steps of ``TOKENS_PER_RANK`` tokens per rank (rank ``r``'s tokens lean towards
    expert ``r``, so one rank's counts are not the whole step's), and the library's bias before each step,
    starting from a bias that is not zero (so that using it in the gates shows at once)."""
    g = generator(world_size)
    n = world_size * TOKENS_PER_RANK
    logits = torch.randn(steps, n, N_EXPERTS, generator=g, dtype=torch.float64)
    for r in range(world_size):
        logits[:, r * TOKENS_PER_RANK:(r + 1) * TOKENS_PER_RANK, r % N_EXPERTS] += 1.5
    scores = torch.sigmoid(logits)  # (steps, T, E)
    bias = 0.2 * torch.sin(torch.arange(N_EXPERTS, dtype=torch.float64) + world_size)
    biases, answers = [], []
    for s in range(steps):
        experts, gates = library_choice(scores[s], bias)
        counts = torch.bincount(experts.flatten(), minlength=N_EXPERTS)
        biases.append(bias)
        answers.append((experts, gates, counts))
        bias = bias_update(bias, counts, RATE)
    return {"scores": scores, "biases": biases, "answers": answers, "after": [*biases[1:], bias]}


def library_choice(scores: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(experts, gates)``: the top ``K`` of ``scores + bias``, weighted by the chosen scores normalised."""
    experts = torch.sort(scores + bias, dim=-1, descending=True, stable=True).indices[:, :K]  # (T, K)
    chosen = scores.gather(1, experts)
    return experts, chosen / chosen.sum(dim=-1, keepdim=True)


def _run_learner(ctx, fn, scores, biases, k, rate):
    """What each rank runs: the learner's function on its tokens, once per step, from the library's bias."""
    mine = slice(ctx.rank * TOKENS_PER_RANK, (ctx.rank + 1) * TOKENS_PER_RANK)
    return [fn(ctx, scores[s, mine].clone(), biases[s].clone(), k, rate) for s in range(len(biases))]


class _Alone:
    """A one-rank stand-in for ``ctx`` (every collective hands its input back), to see whether the
    function is written without sending a blank starter to the ranks."""

    rank, world_size, device = 0, 1, torch.device("cpu")

    def __init__(self) -> None:
        self.comm = self

    def __getattr__(self, name):
        return lambda tensor, *args, **kwargs: tensor


def _written(fn) -> bool:
    inputs, probe = bias_exercise_inputs(1, 1), Collector("probe", "one rank, alone")
    call(probe, "alone", fn, _Alone(), inputs["scores"][0], inputs["biases"][0], K, RATE)
    return not probe.not_written


def _same(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=ATOL)


def _by_expert(experts: torch.Tensor, gates: torch.Tensor) -> list[dict[int, float]]:
    return [dict(zip(e.tolist(), g.tolist())) for e, g in zip(experts, gates)]


def _choice_hint(experts, scores, bias) -> str:
    plain = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :K]
    want = library_choice(scores, bias)[0]
    mine, plain_sets, want_sets = ([set(row) for row in t.tolist()] for t in (experts, plain, want))
    if mine == plain_sets and plain_sets != want_sets:
        return ("you chose by the scores alone: the bias is there to choose, so take the top-k of scores + bias "
                "(it is what moves tokens off a busy expert)")
    t = next(i for i, (a, b) in enumerate(zip(mine, want_sets)) if a != b)
    return f"token {t}: you chose experts {sorted(mine[t])}, the top-{K} of scores + bias is {sorted(want_sets[t])}"


def _gate_hint(experts, gates, scores, bias) -> str:
    mine = _by_expert(experts, gates)
    biased = scores + bias
    chosen = biased.gather(1, experts)
    candidates = {
        "your gates use the bias: the bias only chooses the experts; weigh them by their scores without it, "
        "normalised over the k chosen": chosen / chosen.sum(dim=-1, keepdim=True),
        "your gates are the raw scores: normalise them over the k chosen, so each token's gates sum to 1":
            scores.gather(1, experts),
        "your gates are the scores plus the bias, not normalised: leave the bias out of the gates and normalise "
        "the chosen scores to sum to 1": chosen,
    }
    for hint, want in candidates.items():
        if all(abs(g - w) < ATOL for row, wrow in zip(mine, _by_expert(experts, want)) for g, w in
               zip(row.values(), (wrow[e] for e in row))):
            return hint
    return "each token's gates are its chosen experts' scores (without the bias) divided by their sum"


def _bias_hint(new_bias, bias, local_counts, counts) -> str:
    mean, local_mean = counts.double().mean(), local_counts.double().mean()
    candidates = {
        "the sign is flipped: an expert that took more than the mean load must get a lower bias, "
        "bias + rate * sign(mean load - load), so that fewer tokens choose it next step":
            bias - RATE * torch.sign(mean - counts.double()),
        "the counts were not summed over the ranks: this rank's own load moved its bias, so the ranks' biases "
        "drift apart; sum the counts with ctx.comm.all_reduce before the update":
            bias + RATE * torch.sign(local_mean - local_counts.double()),
        "the counts were not summed over the ranks, and the sign is flipped: sum them with ctx.comm.all_reduce, "
        "then lower the bias of the experts above the mean load":
            bias - RATE * torch.sign(local_mean - local_counts.double()),
        "the update uses the load difference itself: DeepSeek-V3 moves each bias by a fixed step, rate * sign("
        "mean load - load), whatever the size of the difference": bias + RATE * (mean - counts.double()),
    }
    for hint, want in candidates.items():
        if _same(new_bias, want):
            return hint
    return "new_bias must be bias + rate * sign(mean load - load), with the loads counted over every rank"


def grade_aux_free_bias(route_fn, *pools) -> ExerciseResult:
    """Grade a learner's ``aux_free_route(ctx, scores, bias, k, rate) -> (experts, gates, new_bias)`` (see
    the module docstring) on each warm ``Ranks`` pool given (2 and 4 ranks in the notebook), for
    ``STEPS`` steps each."""
    check_callable(route_fn, "aux_free_route")
    if not pools:
        raise ValueError("grade_aux_free_bias needs at least one Ranks pool, e.g. grade_aux_free_bias(fn, ranks)")
    got = Collector("auxiliary-loss-free bias on ranks", "on " + " and ".join(f"{p.world_size} ranks" for p in pools)
                    + f", {STEPS} steps each")
    if not _written(route_fn):
        got.not_written = True
        return got.result()
    for pool in pools:
        w = pool.world_size
        inputs = bias_exercise_inputs(w)
        try:
            results = on_ranks(pool, _run_learner, route_fn, inputs["scores"], inputs["biases"], K, RATE).values
        except RankTimeoutError as err:
            got.fail(f"{w} ranks: ranks {err.ranks_silent} never finished: every rank must call the same "
                     "collectives in the same order (a collective inside `if ctx.rank == ...` hangs the others)")
            continue
        except RankError as err:
            if "NotImplementedError" in err.remote_traceback:
                got.not_written = True
                return got.result()
            got.fail(f"{w} ranks: {str(err).splitlines()[0]}")
            continue
        _grade_pool(got, w, inputs, results)
    return got.result("every rank chose by scores + bias, weighed by the scores alone (normalised), and moved "
                      "the bias by rate * sign(mean load - load) on the loads of every rank, at every step")


def _grade_pool(got: Collector, w: int, inputs: dict, results) -> None:
    for s in range(STEPS):
        experts_all, _, counts = inputs["answers"][s]
        bias = inputs["biases"][s]
        for r in range(w):
            where = f"{w} ranks, step {s + 1}, rank {r}"
            mine = slice(r * TOKENS_PER_RANK, (r + 1) * TOKENS_PER_RANK)
            scores, out = inputs["scores"][s, mine], results[r][s]
            if not (isinstance(out, tuple) and len(out) == 3):
                got.fail(f"{where}: return three things, (experts, gates, new_bias); got {type(out).__name__}")
                return
            experts, gates, new_bias = out
            want_experts, want_gates = library_choice(scores, bias)
            if not (isinstance(experts, torch.Tensor) and experts.shape == (TOKENS_PER_RANK, K)):
                got.fail(f"{where}: experts must be a ({TOKENS_PER_RANK}, {K}) tensor of expert ids, one row "
                         f"per token; got {getattr(experts, 'shape', type(experts).__name__)}")
                return
            experts = experts.long()
            if [set(e) for e in experts.tolist()] != [set(e) for e in want_experts.tolist()]:
                got.fail(f"{where}: {_choice_hint(experts, scores, bias)}")
                return
            mine_g = _by_expert(experts, gates) if isinstance(gates, torch.Tensor) and gates.shape == experts.shape \
                else None
            want_g = _by_expert(want_experts, want_gates)
            if mine_g is None or any(abs(row[e] - wrow[e]) > ATOL for row, wrow in zip(mine_g, want_g) for e in row):
                got.fail(f"{where}: {_gate_hint(experts, gates, scores, bias)}" if mine_g is not None else
                         f"{where}: gates must be a ({TOKENS_PER_RANK}, {K}) tensor, one gate per chosen expert")
                return
            if not _same(new_bias, inputs["after"][s]):
                local = torch.bincount(experts_all[mine].flatten(), minlength=N_EXPERTS)
                got.fail(f"{where}: {_bias_hint(new_bias, bias, local, counts)}"
                         if isinstance(new_bias, torch.Tensor) and new_bias.shape == bias.shape else
                         f"{where}: new_bias must be a ({N_EXPERTS},) tensor, one bias per expert")
                return
