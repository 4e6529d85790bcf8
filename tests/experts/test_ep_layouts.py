"""Expert parallelism in a serving layout on real ranks: the toy with MoE MLPs over tp x ep x pp, equal to one
process, its traffic per axis (all-to-alls included) as predicted; wide EP with data-parallel attention beside
tp attention, bytes and memory per rank measured and predicted."""

import pytest
import torch

from shardlib.core.checks import TOLERANCE
from shardlib.core.experts.dispatch import moe_stack_reference, moe_stack_weights
from shardlib.core.mesh import Layout
from shardlib.core.toy import activations, stack_weights
from shardlib.facts.models import TOY, TOY_MOE
from shardlib.lab.serving.drivers import check_combined_inputs, run_combined, run_decode, run_wide_ep
from shardlib.predict.serving.memory import stack_weight_bytes
from shardlib.predict.serving.traffic import AxisTraffic, forward_traffic
from shardlib.ui.serving_tables import traffic_table

LAYERS = moe_stack_weights(TOY_MOE, seed=0)
X = activations(4, 8, TOY_MOE.d_model)
REFERENCE = moe_stack_reference(X, LAYERS, TOY_MOE)

MESHES = {2: [Layout(tp=1, pp=1, dp=2, ep=2), Layout(tp=2, pp=1, ep=2), Layout(tp=1, pp=2)],
          4: [Layout(tp=2, pp=2, ep=2), Layout(tp=1, pp=2, dp=2, ep=2), Layout(tp=2, pp=1, dp=2, ep=4),
              Layout(tp=4, pp=1, ep=2), Layout(tp=1, pp=1, dp=4, ep=4)]}


def same_pieces_reference(ctx, layout, n_microbatches):
    """Rank 0, with a rank's thread count, runs the one-process stack on the pieces the ranks run (each
    replica's share, cut into microbatches): bit for bit is promised against the same pieces."""
    if ctx.rank:
        return None
    return torch.cat([moe_stack_reference(mb, LAYERS, TOY_MOE) for part in X.tensor_split(layout.dp)
                      for mb in part.tensor_split(n_microbatches)])


@pytest.mark.parametrize("world", [2, 4], ids=["world2", "world4"])
def test_tp_ep_pp_forward_equals_one_process(world, request):
    pool = request.getfixturevalue(f"pool{world}")
    for layout in MESHES[world]:
        m = 2 if layout.dp < 4 else 1  # 4 sequences: 2 microbatches per replica, 1 when each rank has one
        run = run_combined(pool, layout, TOY_MOE, LAYERS, X, n_microbatches=m)
        if layout.tp == 1:  # no cross-rank sum anywhere: the experts' rows come back exactly
            assert torch.equal(run.output, pool.run(same_pieces_reference, layout, m)[0]), layout.label
        # the tp all-reduce adds the heads' partial outputs in another order: float32, TOLERANCE
        assert torch.allclose(run.output, REFERENCE, atol=TOLERANCE, rtol=TOLERANCE), layout.label
        assert run.last_stage_agree
        assert run.measured == run.predicted, (layout.label, traffic_table(run))
        assert list(run.weight_bytes) == stack_weight_bytes(TOY_MOE, layout)
        if layout.ep > 1:
            assert any(a.axis == "ep" and a.op == "all_to_all_single" for a in run.measured)


def test_forward_traffic_of_an_moe_layout_by_hand():
    # Layout(tp=2, pp=2, ep=2): 4 layers, 2 microbatches of 2 x 8 tokens, float32, d 64, k 2, 8 experts
    mb = 2 * 8 * 64 * 4
    got = {(a.axis, a.op): a for a in forward_traffic(TOY_MOE, Layout(tp=2, pp=2, ep=2), 4, 8, 2)}
    assert got[("tp", "all_reduce")] == AxisTraffic("tp", "all_reduce", 2 * 4 * 2, 16 * mb)  # the attention's
    assert got[("tp", "all_gather")] == AxisTraffic("tp", "all_gather", 16, 16 * mb)  # the MoE's rows, whole again
    # per layer and microbatch: 2 ranks x (counts 8 x 8 B) + dispatch and combine of the stage's 32 tokens x 2
    assert got[("ep", "all_to_all_single")] == AxisTraffic("ep", "all_to_all_single", 3 * 2 * 4 * 2,
                                                           (2 * 64 + 2 * mb * 2) * 4 * 2)
    assert got[("pp", "send")].count == 1 * 2 * 2
    dense = {(a.axis, a.op) for a in forward_traffic(TOY, Layout(tp=2, pp=2), 4, 8, 2)}
    assert ("tp", "all_gather") not in dense and ("ep", "all_to_all_single") not in dense


def test_wide_ep_with_dp_attention_against_tp_attention(pool4):
    cmp = run_wide_ep(pool4, TOY_MOE, LAYERS, X)
    assert torch.equal(cmp.dp_attention.output, pool4.run(same_pieces_reference, cmp.dp_attention.layout, 1)[0])
    assert torch.allclose(cmp.tp_attention.output, REFERENCE, atol=TOLERANCE, rtol=TOLERANCE)
    dp_row, tp_row = cmp.rows()
    for row in (dp_row, tp_row):
        assert row["weights_measured"] == row["weights_predicted"]
        assert row["comm_measured"] == row["comm_predicted"]
    # DP attention keeps the whole attention on every rank, but sends only the experts' rows
    assert dp_row["weights_measured"] > tp_row["weights_measured"]
    assert dp_row["comm_measured"] < tp_row["comm_measured"]
    assert {a.axis for a in cmp.dp_attention.measured} == {"ep"}
    assert {a.axis for a in cmp.tp_attention.measured} == {"ep", "tp"}


def test_bad_expert_layouts_are_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match="ep = 3 does not divide the 8 experts of toy-moe: each rank holds whole"):
        check_combined_inputs(Layout(tp=1, pp=1, dp=3, ep=3), TOY_MOE, LAYERS, activations(3, 8, 64), 1)
    with pytest.raises(ValueError, match=r"ep = 4 must divide the tp x dp = 1 x 2 = 2 ranks of a stage"):
        check_combined_inputs(Layout(tp=1, pp=2, dp=2, ep=4), TOY_MOE, LAYERS, X, 2)
    with pytest.raises(ValueError, match="give its MoE weights"):
        check_combined_inputs(Layout(tp=1, pp=1, dp=2, ep=2), TOY_MOE, stack_weights(TOY_MOE), X, 2)
    with pytest.raises(ValueError, match="the combined run on ranks splits dense blocks: ep must be 1"):
        check_combined_inputs(Layout(tp=2, pp=2, ep=2), TOY, stack_weights(TOY), activations(4, 6, 64), 1)
    with pytest.raises(ValueError, match="a microbatch of 3 tokens does not split over tp = 2"):
        check_combined_inputs(Layout(tp=2, pp=1, ep=2), TOY_MOE, LAYERS, activations(2, 3, 64), 2)


def test_pipelined_decode_with_experts_equals_one_process(pool4):
    x = activations(4, 1, TOY_MOE.d_model, seed=7)  # (batch, 1, d): one token per sequence, fed back each step
    steps, expected, h = 3, [], x
    for _ in range(steps):
        h = moe_stack_reference(h, LAYERS, TOY_MOE)
        expected.append(h)
    for layout in (Layout(tp=1, pp=2, dp=2, ep=2), Layout(tp=2, pp=2, ep=2)):
        run = run_decode(pool4, layout, TOY_MOE, LAYERS, x, n_microbatches=2, steps=steps)
        assert torch.allclose(run.outputs, torch.stack(expected), atol=TOLERANCE, rtol=TOLERANCE), layout.label
