"""Each grader's properties, for partial credit: a right answer holds every one, a blank starter none, and an
answer that breaks only a later property still holds the earlier ones (the grader's declared order)."""

import importlib
import inspect
import sys

import cloudpickle
import pytest
import torch
from serving.test_engine_exercise import Blank, Leaks  # the block manager's blank and leaking mistakes
from solutions_module import answers

import shardlib.exercises as exercises
from shardlib.core.pipeline.registry import make_schedule
from shardlib.core.toy import activations, stack_weights
from shardlib.exercises import training
from shardlib.exercises.bubble import grade_bubble_fraction, grade_pass_time
from shardlib.exercises.context_parallel import grade_merge_partial_attention
from shardlib.exercises.costs import grade_fit_alpha_beta
from shardlib.exercises.experts import grade_aux_free_bias, grade_dispatch_plan, grade_top_k_router
from shardlib.exercises.mesh import grade_mesh_coordinates
from shardlib.exercises.pipeline import grade_one_f_one_b, grade_schedule_table, grade_small_table
from shardlib.exercises.serving_at_scale import PrefixRouterState, grade_prefix_router
from shardlib.exercises.serving_engine import grade_block_manager
from shardlib.exercises.tensor_parallel import grade_shard_rows
from shardlib.exercises.training_ledger import activation_bytes_per_microbatch
from shardlib.facts.models import TOY
from shardlib.predict.pipeline import peak_in_flight

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the rank functions below travel by value


def blank(*args):
    raise NotImplementedError("write this function")


def holding(result) -> dict[str, bool]:
    return {check: result.holds(check) for check in result.checks}


def assert_holds(result, *held: str) -> None:
    """Exactly the properties ``held`` hold, the others not."""
    assert holding(result) == {check: check in held for check in result.checks}, str(result)


def graders():
    for name in exercises.__all__:
        module = importlib.import_module(f"shardlib.exercises.{name}")
        yield from (fn for fn_name, fn in inspect.getmembers(module, inspect.isfunction)
                    if fn_name.startswith("grade_") and fn.__module__ == module.__name__)


@pytest.mark.parametrize("grader", list(graders()), ids=lambda g: g.__name__)
def test_every_grader_declares_its_properties_and_their_points(grader):
    assert isinstance(getattr(grader, "checks", None), dict) and grader.checks, grader.__name__
    assert all(isinstance(p, int) and p >= 1 for p in grader.checks.values())
    assert 2 <= sum(grader.checks.values()) <= 5, grader.checks
    assert f"{grader.__name__}.checks" in inspect.getsource(grader)  # and hands them to its Collector


def test_all_seventeen_graders_are_found():
    assert len(list(graders())) == 17


def test_the_blank_starters_hold_nothing():
    for result in (grade_shard_rows(blank), grade_bubble_fraction(blank), grade_pass_time(blank),
                   grade_one_f_one_b(blank),
                   grade_top_k_router(blank), grade_dispatch_plan(blank), grade_merge_partial_attention(blank),
                   grade_fit_alpha_beta(blank), grade_small_table(blank), grade_schedule_table(blank),
                   grade_mesh_coordinates(blank, blank), grade_prefix_router(BlankRouter),
                   grade_block_manager(Blank)):
        assert result.status == "not written yet" and not any(holding(result).values()), str(result)


def test_the_answers_hold_everything():
    for result in (grade_shard_rows(answers.shard_rows), grade_one_f_one_b(answers.one_f_one_b),
                   grade_pass_time(answers.pass_time),
                   grade_top_k_router(answers.top_k_router), grade_dispatch_plan(answers.plan_dispatch),
                   grade_merge_partial_attention(answers.merge_partials), grade_fit_alpha_beta(answers.fit_alpha_beta),
                   grade_small_table(answers.small_table), grade_schedule_table(answers.my_schedule),
                   grade_mesh_coordinates(answers.mesh_coordinates, answers.mesh_groups),
                   grade_prefix_router(answers.PrefixRouter), grade_block_manager(answers.PrefixBlockManager)):
        assert result.passed and all(holding(result).values()), str(result)


# -- answers right in all but a later property ------------------------------------------------------------
def test_shard_rows_that_never_refuses_holds_the_slices():
    assert_holds(grade_shard_rows(lambda weight, n: list(weight.chunk(n, dim=1))), "slices")


def test_a_bubble_fraction_that_never_refuses_holds_the_values():
    assert_holds(grade_bubble_fraction(lambda p, m: (p - 1) / (m + p - 1)), "values")


def _warmup(count):
    """1F1B's shape with ``count(stage, p, m)`` forwards first (1F1B: ``p - s - 1``)."""
    def order(stage, p, m):
        w = max(0, min(count(stage, p, m), m))
        row = [("F", i) for i in range(w)]
        for k in range(m - w):
            row += [("F", w + k), ("B", k)]
        return row + [("B", i) for i in range(m - w, m)]
    return order


def test_one_f_one_b_orders_hold_up_to_their_first_broken_property():
    gpipe = grade_one_f_one_b(lambda s, p, m: [("F", i) for i in range(m)] + [("B", i) for i in range(m)])
    assert_holds(gpipe, "order")
    assert_holds(grade_one_f_one_b(_warmup(lambda s, p, m: 0)), "order", "memory")  # too slow
    twice = grade_one_f_one_b(lambda s, p, m: answers.one_f_one_b(s, p, m) + [("F", 0)])
    assert_holds(twice)


def test_a_property_left_unchecked_without_ranks_cannot_be_awarded():
    for result, check in ((grade_one_f_one_b(answers.one_f_one_b), "on_ranks"),
                          (grade_schedule_table(answers.my_schedule), "on_ranks"),
                          (grade_fit_alpha_beta(answers.fit_alpha_beta), "live"),
                          (grade_mesh_coordinates(answers.mesh_coordinates, answers.mesh_groups), "on_ranks")):
        assert result.passed and check not in result.checks
        with pytest.raises(ValueError, match=f"not '{check}'"):
            result.holds(check)


def test_schedule_tables_that_run_but_idle_hold_runs_only():
    gpipe = lambda p, m: [[f"{op}{i}" for op in "FBW" for i in range(m)] for _ in range(p)]  # noqa: E731
    assert_holds(grade_schedule_table(gpipe), "runs")
    wrong_first = [["F0", "F1", "B0", "B1", "W0", "W1"], ["F0", "F1", "B0", "B1", "W0", "W1"]]
    assert_holds(grade_small_table(lambda: wrong_first), "runs")
    assert_holds(grade_small_table(lambda: [["F0", "W0"], ["F0"]]))


def test_a_router_with_softmax_gates_over_all_experts_holds_the_experts():
    def all_experts_softmax(x, router, k):
        logits = x @ router.T
        experts = logits.topk(k, dim=-1).indices
        return experts, torch.softmax(logits, -1).gather(1, experts)
    assert_holds(grade_top_k_router(all_experts_softmax), "experts")


def test_a_dispatch_plan_in_token_order_holds_the_destinations():
    def token_order(experts, n_experts, ep):
        owner = experts.flatten() // (n_experts // ep)
        return torch.sort(owner, stable=True).indices, torch.bincount(owner, minlength=ep).tolist()
    assert_holds(grade_dispatch_plan(token_order), "destinations")


def test_a_merge_holds_up_to_its_first_wrong_statistic():
    def wrong_max(out_a, max_a, sum_a, out_b, max_b, sum_b):
        out, _, new_sum = answers.merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b)
        return out, torch.minimum(max_a, max_b), new_sum

    def sum_not_rescaled(out_a, max_a, sum_a, out_b, max_b, sum_b):
        out, new_max, _ = answers.merge_partials(out_a, max_a, sum_a, out_b, max_b, sum_b)
        return out, new_max, sum_a + sum_b
    assert_holds(grade_merge_partial_attention(wrong_max), "out")
    assert_holds(grade_merge_partial_attention(sum_not_rescaled), "out", "max")


# -- the prefix router and the block manager ----------------------------------------------------------------
class BlankRouter(PrefixRouterState):
    def route(self, request):
        raise NotImplementedError


def router(rule, count=True):
    """A router choosing by ``rule(self, request)``, updating ``queued`` where ``count``."""
    class Router(PrefixRouterState):
        def route(self, request):
            k = rule(self, request)
            self.queued[k] += count
            self.remember(k, request)
            return k
    return Router


def _least(self):
    return min(range(len(self.queued)), key=lambda i: (self.queued[i], i))


def _prefix_first(self, request):  # the balance threshold ignored
    matched = self.matched_blocks(request)
    if max(matched) == 0:
        return _least(self)
    return min(range(len(self.queued)), key=lambda i: (-matched[i], self.queued[i], i))


def _ties_to_lower_index(self, request):  # the load ignored between equal matches
    matched = self.matched_blocks(request)
    if max(self.queued) - min(self.queued) > self.balance_threshold or max(matched) == 0:
        return _least(self)
    return matched.index(max(matched))


def test_routers_hold_up_to_their_first_broken_property():
    assert_holds(grade_prefix_router(router(_prefix_first)), "records", "prefix")
    assert_holds(grade_prefix_router(router(_ties_to_lower_index)), "records")
    assert_holds(grade_prefix_router(router(_prefix_first, count=False)))


Good = answers.PrefixBlockManager


class CachesTheLastToken(Good):
    def allocate(self, seq, tokens):
        cached = super().allocate(seq, tokens)
        return len(tokens) if len(tokens) % self.block_size == 0 and cached == len(tokens) - self.block_size else cached


class NeverEvicts(Good):
    def allocate(self, seq, tokens):
        keep = [b for b in self.free_blocks if b in self.name_of]
        self.free_blocks = [b for b in self.free_blocks if b not in self.name_of]
        try:
            return super().allocate(seq, tokens)
        finally:
            self.free_blocks += keep


def test_block_managers_hold_up_to_their_first_broken_property():
    assert_holds(grade_block_manager(Leaks), "allocate", "prefix_reuse")
    assert_holds(grade_block_manager(CachesTheLastToken), "allocate")
    assert_holds(grade_block_manager(NeverEvicts), "allocate")  # a request starved in the tight cache


# -- the training memory, against the grader's model of the ledger (no training run) ----------------------------
class NotAPool:
    world_size = 4

    def run(self, *args, **kwargs):
        raise AssertionError("the grader started the ranks")


@pytest.fixture
def modelled_ledgers(monkeypatch):
    """The grader's ledgers from the model the measured ones are tested equal to (test_training_exercise)."""
    def model(ranks):
        return tuple([{**answers.rank_memory(config, layout, rank),
                       "activations": activation_bytes_per_microbatch(config, layout, rank)
                       * peak_in_flight(make_schedule("1f1b", layout.pp, config.m))[layout.position(rank).stage]}
                      for rank in range(layout.world_size)] for config, layout in training.LAYOUTS)
    monkeypatch.setattr(training, "measured_ledgers", model)


def test_training_memory_holds_the_steady_state_before_the_activations(modelled_ledgers):
    assert_holds(training.grade_training_memory(answers.rank_memory, NotAPool()), "steady_state", "activations")

    def doubled(term):
        return lambda c, L, r: {**answers.rank_memory(c, L, r), term: 2 * answers.rank_memory(c, L, r)[term]}
    assert_holds(training.grade_training_memory(doubled("activations"), NotAPool()), "steady_state")
    assert_holds(training.grade_training_memory(doubled("optimizer"), NotAPool()))
    assert_holds(training.grade_training_memory(blank, NotAPool()))

    part_one = training.grade_training_memory(lambda c, L, r: {k: v for k, v in answers.rank_memory(c, L, r).items()
                                                                if k != "activations"}, NotAPool())
    assert part_one.passed and part_one.holds("steady_state")
    with pytest.raises(ValueError, match="not 'activations'"):
        part_one.holds("activations")


# -- on real ranks: few runs, each costs seconds ------------------------------------------------------------
def test_one_f_one_b_on_ranks(pool2):
    layers = stack_weights(TOY, seed=0, parts=("mlp",), n_layers=4)
    x, grad = activations(8, 2, TOY.d_model, seed=1), activations(8, 2, TOY.d_model, seed=2)
    assert_holds(grade_one_f_one_b(answers.one_f_one_b, pool2, TOY, layers, x, grad),
                 "order", "memory", "time", "on_ranks")


def test_a_fit_right_on_paper_but_not_on_the_live_sweep_holds_synthetic(pool2):
    calls = []

    def off_live(sizes, times):  # the 6th call is the live sweep
        calls.append(1)
        latency, bandwidth = answers.fit_alpha_beta(sizes, times)
        return (latency, bandwidth) if len(calls) <= 5 else (1.5 * latency + 1e-5, 1.5 * bandwidth)
    assert_holds(grade_fit_alpha_beta(off_live, pool2), "synthetic")


def _swapped_on_ranks(rank, tp, pp, dp):
    """The right groups here; on the ranks (where torch.distributed runs), tp and dp swapped."""
    groups = answers.mesh_groups(rank, tp, pp, dp)
    return {**groups, "tp": groups["dp"], "dp": groups["tp"]} if torch.distributed.is_initialized() else groups


def test_mesh_groups_on_ranks(pool2):
    assert_holds(grade_mesh_coordinates(answers.mesh_coordinates, answers.mesh_groups, pool2),
                 "coordinates", "groups", "on_ranks")
    assert_holds(grade_mesh_coordinates(answers.mesh_coordinates, _swapped_on_ranks, pool2), "coordinates", "groups")
    def empty(rank, tp, pp, dp):
        return dict.fromkeys(("tp", "pp", "dp"), [])
    assert_holds(grade_mesh_coordinates(answers.mesh_coordinates, empty, pool2), "coordinates")  # no rank runs


def _bias(ctx, scores, bias, k, rate, sign=1):
    experts = torch.topk(scores + bias, k, dim=-1).indices
    chosen = scores.gather(1, experts)
    counts = torch.bincount(experts.flatten(), minlength=scores.shape[1])
    ctx.comm.all_reduce(counts)
    load = counts.double()
    return experts, chosen / chosen.sum(-1, keepdim=True), bias + sign * rate * torch.sign(load.mean() - load)


def test_aux_free_bias_on_ranks(pool2):
    assert_holds(grade_aux_free_bias(_bias, pool2), "experts", "gates", "bias")
    assert_holds(grade_aux_free_bias(lambda *args: _bias(*args, sign=-1), pool2), "experts", "gates")
    assert_holds(grade_aux_free_bias(blank, pool2))
