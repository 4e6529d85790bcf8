"""Pipeline parallelism on real ranks (2 and 4), driven by the schedule data.

Exactness: pipelining adds no cross-rank sum, so outputs, input gradients and weight gradients are
compared with ``torch.equal`` against the unpipelined model run on the same microbatches (gradients
accumulated in microbatch order, as the stages accumulate them). Against one pass over the whole batch,
gradients are summed in another order: ``allclose`` with ``rtol = atol = 1e-5``.

Timing: not asserted here (the notebooks under nbval and ``benchmarks/bench_pipeline.py`` claim it).
Where a test pads each forward and backward with sleep to a set duration, it checks what does not depend
on the clock: the duration each rank's spans were padded to, the schedule's prediction, and that the idle
fraction (``pipeline.MeasuredBubble``: over the window from the first compute span's start to the last
one's end across ranks, ``1 - busy / (p x window)``) is a fraction.
"""

import dataclasses
import math

import pytest
import torch
from torch import nn

from shardlib.core.config import ModelConfig
from shardlib.core.model import block_reference
from shardlib.core.pipeline.registry import SCHEDULES, SPECS, make_schedule
from shardlib.core.pipeline.schedules import Action, Schedule
from shardlib.core.pipeline.stages import layers_of_stage, split_layers, stage_layer_counts
from shardlib.core.toy import activations, stack_weights
from shardlib.lab.harness import Measured
from shardlib.lab.pipeline.step import pipeline_step_on_rank, run_pipeline, unpipelined_step
from shardlib.predict.pipeline import (
    compute_spans,
    measured_in_flight,
    messages_per_step,
    peak_in_flight,
    predicted_step_s,
)
from shardlib.runtime.errors import RankError

N_LAYERS, BATCH, SEQ, D_MODEL = 8, 16, 4, 32
SHAPE = ModelConfig("pipeline test", n_layers=N_LAYERS, d_model=D_MODEL, n_heads=4, n_kv_heads=2, d_ff=2 * D_MODEL,
                    vocab_size=64, bytes_per_param=4.0)
MLP = ("gate", "up", "down")
RTOL = ATOL = 1e-5  # against one whole-batch pass only; everything else is exact
GRID_OP_S = 0.002  # set duration of each forward and of each backward: no timing is claimed here
GRID_MICROBATCHES = (1, 4, 16)  # a subset: benchmarks/bench_pipeline.py measures 1, 2, 4, 8, 16


@pytest.fixture(scope="module")
def model():
    """The toy's MLP-only layers (``layers``) and whole transformer blocks (``blocks``), with a batch."""
    return {"layers": stack_weights(SHAPE, seed=0, parts=("mlp",)), "blocks": stack_weights(SHAPE, seed=0),
            "x": activations(BATCH, SEQ, D_MODEL, seed=1), "grad": activations(BATCH, SEQ, D_MODEL, seed=2)}


def run_on(pool, schedule, layers, x, grad_output=None, forward_s=None, backward_s=None):
    return run_pipeline(pool, schedule, SHAPE, layers, x, grad_output, forward_s, backward_s)


def _equal_grads(a, b):
    return len(a) == len(b) and all(ga.keys() == gb.keys() and all(torch.equal(ga[k], gb[k]) for k in ga)
                                    for ga, gb in zip(a, b))


# -- exactness -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name, n_chunks", [(n, SPECS[n].n_chunks(2)) for n in SCHEDULES
                                            if not SPECS[n].split_backward])  # whole backward; the split: schedules
@pytest.mark.parametrize("factor", [1, 2])
def test_training_step_equals_the_unpipelined_model(pool, model, name, n_chunks, factor):
    p = pool.world_size
    m = factor * p
    schedule = make_schedule(name, p, m, training=True, n_chunks=n_chunks)
    run = run_on(pool, schedule, model["layers"], model["x"], model["grad"])
    exact = run.against_reference()
    assert exact.bit_for_bit and exact.whole_batch_close, exact
    # the check itself, spelled out once: the same microbatches in one process, bit for bit
    same_microbatches = unpipelined_step(SHAPE, model["layers"], model["x"], m, model["grad"])
    assert torch.equal(run.output, same_microbatches["output"])
    assert torch.equal(run.grad_x, same_microbatches["grad_x"])
    assert _equal_grads(run.grads, same_microbatches["grads"])
    whole_batch = unpipelined_step(SHAPE, model["layers"], model["x"], 1, model["grad"])
    assert all(torch.allclose(a[k], b[k], rtol=RTOL, atol=ATOL)
               for a, b in zip(run.grads, whole_batch["grads"]) for k in MLP)
    # each rank held only its own layers, contiguous, one slice per chunk
    held = run.layers_held
    assert sorted(sum(held, [])) == list(range(N_LAYERS))
    assert all(len(h) == N_LAYERS // p for h in held)
    # one message per microbatch per boundary, each way: read from the comm log
    per_message = (BATCH // m) * SEQ * D_MODEL * 4
    assert run.sent_messages() == messages_per_step(schedule) == 2 * (p * n_chunks - 1) * m
    assert run.sent_bytes() == run.sent_messages() * per_message


def test_whole_transformer_blocks_pipeline_exactly_too(pool, model):
    """Stages of whole blocks (attention and MLP): attention mixes tokens within a sequence, never
    across sequences, so cutting the batch into microbatches still changes nothing."""
    run = run_on(pool, make_schedule("1f1b", pool.world_size, 4), model["blocks"], model["x"], model["grad"])
    exact = run.against_reference()
    assert exact.bit_for_bit and exact.whole_batch_close, exact
    assert set(run.grads[0]) == {"q", "k", "v", "o", "gate", "up", "down"}


def test_a_wrong_step_is_caught_by_the_reference_check(pool2, model):
    """``against_reference`` can fail: a step whose output was tampered with is not bit for bit."""
    run = run_on(pool2, make_schedule("gpipe", 2, 4), model["layers"], model["x"], model["grad"])
    nudged = [{**v, "output": None if v["output"] is None else v["output"] + 1e-6} for v in run.got.values]
    tampered = Measured.of(nudged)
    assert not dataclasses.replace(run, got=tampered).against_reference().bit_for_bit
    assert run.against_reference().bit_for_bit


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_inference_step_equals_the_unpipelined_model(pool, model, name):
    p = pool.world_size
    for m in (1, 3, 8):  # 3 does not divide the batch of 16: microbatches of 6, 5 and 5 rows
        run = run_on(pool, make_schedule(name, p, m, training=False), model["layers"], model["x"])
        assert torch.equal(run.output, unpipelined_step(SHAPE, model["layers"], model["x"], m)["output"])
        assert run.grad_x is None and run.grads == [] and run.peak_in_flight == (0,) * p


def test_in_flight_measured_1f1b_holds_p_gpipe_holds_m(pool4, model):
    m = 8
    runs = {name: run_on(pool4, make_schedule(name, 4, m), model["layers"], model["x"], model["grad"])
            for name in ("gpipe", "1f1b")}
    assert runs["gpipe"].peak_in_flight == (8, 8, 8, 8) == peak_in_flight(make_schedule("gpipe", 4, m))
    assert runs["1f1b"].peak_in_flight == (4, 3, 2, 1) == peak_in_flight(make_schedule("1f1b", 4, m))
    for name, run in runs.items():  # read back from the real timeline
        assert measured_in_flight(run.spans, 4) == run.peak_in_flight, name
    # activation memory, measured with saved-tensor hooks, follows the count: equal-sized microbatches
    gpipe_bytes, one_f_bytes = runs["gpipe"].peak_activation_bytes, runs["1f1b"].peak_activation_bytes
    per_microbatch = gpipe_bytes[0] // m
    assert per_microbatch > 0 and all(b == gpipe_bytes[0] for b in gpipe_bytes)
    assert one_f_bytes == tuple(k * per_microbatch for k in (4, 3, 2, 1))


# -- padded steps ----------------------------------------------------------------------------------------
def _padded_to(run, op="F"):
    """Per rank, the durations its ``op`` spans were padded to (set by the schedule's padding, not measured)."""
    return [{s.attrs["padded_to_s"] for s in compute_spans(run.spans) if s.rank == r and s.attrs["op"] == op}
            for r in range(run.schedule.n_stages)]


def test_a_slow_stage_is_padded_on_its_own_rank_and_paces_the_predicted_step(pool, model):
    """One stage twice as slow, three repeats, the median kept: every forward of the slow stage is padded to
    twice the others' in every repeat, the step stays exact, and the schedule's simulation puts the whole
    step at that stage's pace. Whether the measured step follows is the notebook's claim (``run_pace_check``)."""
    p, m, op_s = pool.world_size, 8, 0.005
    slow = 1
    durations = [op_s] * p
    durations[slow] = 2 * op_s
    schedule = make_schedule("gpipe", p, m, training=False)
    runs = run_pipeline(pool, schedule, SHAPE, model["layers"], model["x"], forward_s=durations, repeats=3)
    run = runs.fastest()
    assert run.forward_s == durations and run.against_reference().bit_for_bit
    assert run.repeats == len(runs.bubbles) == 3 and run.bubble.window_s == min(b.window_s for b in runs.bubbles)
    for each in map(runs.at, range(runs.repeats)):  # each repeat's spans on their own: m forwards per rank, each padded
        assert _padded_to(each) == [{d} for d in durations]
        forwards = [s.rank for s in compute_spans(each.spans) if s.attrs["op"] == "F"]
        assert [forwards.count(r) for r in range(p)] == [m] * p
    assert len(run.bubble.busy_s) == p and all(math.isfinite(b) and b > 0 for b in run.bubble.busy_s)
    # sum(t) + (m - 1) max(t), against (m + p - 1) t when every stage takes op_s
    assert predicted_step_s(schedule, op_s, 0) == pytest.approx((m + p - 1) * op_s)
    assert predicted_step_s(schedule, durations, 0) == pytest.approx((p + 1) * op_s + (m - 1) * 2 * op_s)


# -- uneven stages ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_uneven_stages_are_exact_too(pool, model, name):
    """Stages with unequal layer counts, cut evenly (7 layers: 4 + 3, or 2, 2, 2, 1) or set per stage
    (the first and last lighter): the same bit-for-bit equality, each rank holding its count."""
    p = pool.world_size
    seven = model["layers"][:7]
    for layers, counts in ((seven, None), (model["layers"][:6], stage_layer_counts(6, p, end_layers=1))):
        run = run_pipeline(pool, make_schedule(name, p, 2 * p), SHAPE, layers, model["x"], model["grad"],
                           layer_counts=counts)
        exact = run.against_reference()
        assert exact.bit_for_bit and exact.whole_batch_close, (counts, exact)
        expected = counts or [len(r) for r in split_layers(len(layers), p)]
        assert [len(h) for h in run.layers_held] == list(expected)
        assert sum(run.layers_held, []) == list(range(len(layers)))


def test_interleaved_chunks_take_layer_counts_per_virtual_stage(pool, model):
    """With ``v`` chunks per rank the counts are per virtual stage (stage ``s`` of chunk ``c`` is virtual
    stage ``c p + s``): 10 layers over 2 x p slices, the two ends heavier, exact bit for bit."""
    p = pool.world_size
    layers = stack_weights(SHAPE, seed=3, parts=("mlp",), n_layers=10)
    counts = [3, 2, 2, 3] if p == 2 else [2, 1, 1, 1, 1, 1, 1, 2]
    run = run_pipeline(pool, make_schedule("interleaved-1f1b", p, p, n_chunks=2), SHAPE, layers, model["x"],
                       model["grad"], layer_counts=counts)
    assert run.against_reference().bit_for_bit
    held = [list(r) for r in split_layers(10, 2 * p, counts)]
    assert run.layers_held == [held[s] + held[p + s] for s in range(p)]


def test_uneven_cuts_pad_each_stage_to_its_work_and_predict_the_slowest_stages_pace(pool4, model):
    """Each stage's forward padded in proportion to its work (its layers, plus one layer's worth on the end
    stages for the embedding and the loss): an even cut leaves the first stage heaviest, lighter end stages
    balance the work. Each cut runs exactly, holding its counts, each rank padded to its own stage's time;
    the predicted steps follow ``sum(t) + (m - 1) max(t)``. The measured steps are ``run_uneven_check``'s claim."""
    p, m, layer_s = 4, 6, 0.002
    layers = model["layers"][:6]
    schedule = make_schedule("gpipe", p, m, training=False)
    cuts = ((2, 2, 1, 1), stage_layer_counts(6, p, end_layers=1))
    stage_s = {counts: [(c + (1 if s in (0, p - 1) else 0)) * layer_s for s, c in enumerate(counts)] for counts in cuts}
    predicted = {counts: predicted_step_s(schedule, stage_s[counts], 0) for counts in cuts}
    even_predicted, light_predicted = predicted.values()
    assert even_predicted / light_predicted == pytest.approx(23 / 18)  # (8 + 5 x 3) / (8 + 5 x 2) layer-times
    for counts in cuts:
        run = run_pipeline(pool4, schedule, SHAPE, layers, model["x"], forward_s=stage_s[counts],
                           layer_counts=list(counts))
        assert run.against_reference().bit_for_bit, counts
        assert [len(h) for h in run.layers_held] == list(counts)
        assert _padded_to(run) == [{t} for t in stage_s[counts]]


def test_layer_counts_are_checked_before_any_rank_starts(pool2, model):
    schedule = make_schedule("gpipe", 2, 2)
    with pytest.raises(ValueError, match=r"add up to 7, but the model has 8 layers"):
        run_pipeline(pool2, schedule, SHAPE, model["layers"], model["x"], model["grad"], layer_counts=[4, 3])
    with pytest.raises(RankError, match=r"3 layer counts \[2, 3, 3\] for 2 slices"):
        pool2.run(pipeline_step_on_rank, schedule, SHAPE, model["layers"], model["x"], model["grad"],
                  layer_counts=[2, 3, 3])


# -- bad input -----------------------------------------------------------------------------------------
def test_bad_inputs_are_refused_before_any_rank_starts(pool2, model):
    x, layers, grad = model["x"], model["layers"], model["grad"]
    cases = [
        (lambda: run_on(pool2, make_schedule("gpipe", 4, 4), layers, x, grad),
         "this schedule has 4 stages but there are 2 ranks"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers[:1], x, grad),
         "a pipeline of 2 stages needs at least 2 layers, one whole layer per slice; the model has 1"),
        (lambda: run_on(pool2, make_schedule("interleaved-1f1b", 2, 4, n_chunks=3), layers[:5], x, grad),
         "a pipeline of 2 stages x 3 model chunks needs at least 6 layers, one whole layer per slice; the model has 5"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 32), layers, x, grad),
         "cannot cut a batch of 16 rows into 32"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers, x), "needs grad_output"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4, training=False), layers, x, grad), "runs no backwards"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers, x, grad[:8]), "grad_output has shape"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers, x[0], grad), r"\(batch, seq, d_model\)"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers, x[..., :16], grad[..., :16]),
         "the input has 16 features per token but the layers expect d_model = 32"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers, x, grad, forward_s=[0.1]),
         r"forward_s needs one entry per stage \(2\), got 1"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers, x, grad, forward_s=-1),
         r"forward_s \(seconds per op\) must be a number of at least 0, got -1"),
        (lambda: run_on(pool2, "gpipe", layers, x, grad), "expected a Schedule"),
        (lambda: run_on(pool2, make_schedule("gpipe", 2, 4), layers, x.double(), grad.double()),
         "the input's dtype is torch.float64 but the weights are torch.float32"),
        # a hand-made order that would leave the ranks waiting forever is refused as it is built
        (lambda: run_on(pool2, Schedule("gpipe", 2, 1, True, 1, ((Action(0, 0, "B"), Action(0, 0, "F")),
                                                                  (Action(1, 0, "F"), Action(1, 0, "B")))),
                        layers, x, grad), "this order deadlocks"),
    ]
    for call, words in cases:
        with pytest.raises(ValueError, match=words):
            call()
    # called straight on the ranks, the same check fails on every rank: an error, not a hang
    with pytest.raises(RankError, match="this schedule has 4 stages but there are 2 ranks"):
        pool2.run(pipeline_step_on_rank, make_schedule("gpipe", 4, 4), SHAPE, layers, x, grad)
    assert run_on(pool2, make_schedule("gpipe", 2, 2, training=False), layers, x).output.shape == x.shape


# -- the peer: torch.distributed.pipelining --------------------------------------------------------------
def _torch_pipelining(ctx, name, layers, x, grad_output, m):
    """Run torch.distributed.pipelining's ScheduleGPipe / Schedule1F1B over the same layer slices, and
    log the order each stage runs its forwards and backwards in. The first step initialises the stages
    (it runs shape inference); the second is the one compared."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    p, r = ctx.world_size, ctx.rank
    held = list(layers_of_stage(make_schedule(name, p, m), len(layers), r)[0])
    log = []

    class Logged(torch.autograd.Function):
        @staticmethod
        def forward(fctx, t, i):
            fctx.i = i
            return t.view_as(t)

        @staticmethod
        def backward(fctx, grad):
            log.append(f"B{fctx.i}")
            return grad, None

    class Stage(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.ParameterList(nn.Parameter(layers[i][k].clone()) for i in held for k in MLP)
            self.calls = 0

        def forward(self, h):
            i, self.calls = self.calls, self.calls + 1
            log.append(f"F{i}")
            for j in range(len(held)):
                h = block_reference(h, dict(zip(MLP, self.w[3 * j:3 * j + 3])), SHAPE)
            return Logged.apply(h, i)

    module = Stage()
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[name]
    schedule = cls(PipelineStage(module, r, p, ctx.device), m, loss_fn=lambda out, target: (out * target).sum(),
                   scale_grads=False)  # loss = sum(out * grad_output): its gradient is grad_output itself

    def step():
        if r == 0:
            return schedule.step(x)
        return schedule.step(target=grad_output) if r == p - 1 else schedule.step()

    step()
    log.clear()
    module.calls = 0
    module.zero_grad(set_to_none=True)
    out = step()
    grads = {i: {k: module.w[3 * j + n].grad for n, k in enumerate(MLP)} for j, i in enumerate(held)}
    return {"order": log, "output": out, "grads": grads}


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_torch_pipelining_runs_the_same_order_and_gets_the_same_numbers(pool, model, name):
    """torch.distributed.pipelining runs on gloo here. Its stages execute forwards and backwards in the
    same order as our schedule data, and its output and weight gradients equal ours bit for bit.
    (Its static ``Schedule1F1B.pipeline_order`` table in torch 2.13 lists the last stage's forwards as
    1..m instead of 0..m-1; the order it executes, logged here, is the right one.)"""
    p = pool.world_size
    for m in (p, 2 * p):
        ours = run_on(pool, make_schedule(name, p, m), model["layers"], model["x"], model["grad"])
        theirs = pool.run(_torch_pipelining, name, model["layers"], model["x"], model["grad"], m)
        for r in range(p):
            assert theirs[r]["order"] == [a.label for a in ours.schedule.actions[r]]
        assert torch.equal(theirs[-1]["output"], ours.output)
        merged = {i: g for res in theirs for i, g in res["grads"].items()}
        assert _equal_grads([merged[i] for i in sorted(merged)], ours.grads)


def _torch_1f1b_refusal(ctx, m):
    """Build torch's Schedule1F1B with ``m`` microbatches; return its error message (caught on the
    rank, so the pool need not restart)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    stage = PipelineStage(nn.Identity(), ctx.rank, ctx.world_size, ctx.device)
    try:
        Schedule1F1B(stage, m)
    except ValueError as err:
        return str(err)
    return None


def test_torch_1f1b_refuses_fewer_microbatches_than_stages_ours_runs_them(pool, model):
    p = pool.world_size
    refusals = pool.run(_torch_1f1b_refusal, 1)
    words = f"Number of microbatches (1) must be greater than or equal to the number of stages ({p})"
    assert all(words in " ".join(r.split()) for r in refusals)
    assert pool.run(_torch_1f1b_refusal, p) == [None] * p
    ours = run_on(pool, make_schedule("1f1b", p, 1), model["layers"], model["x"], model["grad"])
    assert torch.equal(ours.output, unpipelined_step(SHAPE, model["layers"], model["x"], 1, model["grad"])["output"])


def test_the_microbatch_slider_stays_in_range_and_reruns(pool2, model):
    from shardlib.ui.pipeline_widgets import microbatch_explorer

    x, grad = model["x"][:6], model["grad"][:6]  # 6 rows: at most 6 microbatches
    app = microbatch_explorer(pool2, SHAPE, model["layers"], x, grad, forward_s=0.001, backward_s=0.001,
                              max_microbatches=16)
    (slider, picker), label = app.children[0].children, app.children[1]
    assert (slider.min, slider.max, slider.value) == (1, 6, 4)
    assert "p = 2, m = 4" in label.value
    slider.value = 100  # out of range: the slider clamps it
    assert slider.value == 6 and "GPipe, training: p = 2, m = 6" in label.value
    picker.value = "1f1b"
    assert "1F1B, training: p = 2, m = 6" in label.value and "in flight per stage [2, 1]" in label.value
    assert [name for name, _ in picker.options] == ["GPipe", "1F1B"]


def test_the_microbatch_slider_runs_forward_only_passes_without_a_gradient(pool2, model):
    from shardlib.ui.pipeline_widgets import microbatch_explorer

    app = microbatch_explorer(pool2, SHAPE, model["layers"], model["x"][:6], forward_s=0.001, max_microbatches=16)
    (slider,), label = app.children[0].children, app.children[1]  # no schedule buttons: forward only, one list
    assert "inference (forward only): p = 2, m = 4" in label.value and "in flight" not in label.value
    slider.value = 5
    assert "p = 2, m = 5" in label.value


def test_a_forward_pass_moves_the_batch_once_pipelined_and_once_per_layer_tensor_parallel(pool2, model):
    from shardlib.lab.pipeline.step import run_pipeline_vs_tp_bytes

    layers = model["layers"]
    both = run_pipeline_vs_tp_bytes(pool2, SHAPE, layers, model["x"], n_microbatches=4)  # no gradient: forward only
    assert both.pipeline_messages == 4 and both.pipeline_bytes == both.activation_bytes
    assert both.tp_collectives_per_rank == len(layers) and both.tp_bytes_per_rank == len(layers) * both.activation_bytes
