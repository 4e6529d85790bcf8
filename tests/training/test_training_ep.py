"""The training step with experts: the MoE language model over dp x ep x pp x tp on real ranks, equal to one
process in float64, each rank's ledger and traffic per axis as predicted; both balancing methods."""

import pytest
import torch

from shardlib.core.mesh import Layout
from shardlib.core.training.config import TrainingConfig, init_weights
from shardlib.core.training.reference import train_reference
from shardlib.lab.training.drivers import check_training, run_training
from shardlib.predict.training.ledger import predict_ledger

TOLERANCE = 1e-9  # float64: cross-rank sums (gradients over dp, the stage, the experts' holders) in another order
MOE = TrainingConfig(dtype="float64", n_experts=4, experts_per_token=2, steps=2, m=2)

LAYOUTS = {2: [Layout(tp=1, pp=1, dp=2, ep=2), Layout(tp=2, pp=1, ep=2)],
           4: [Layout(tp=1, pp=2, dp=2, ep=2), Layout(tp=2, pp=2, ep=2),
               Layout(tp=2, pp=1, dp=2, ep=4, dp_strategy="zero1"),
               Layout(tp=2, pp=1, dp=2, ep=2, dp_strategy="zero2")]}
LEDGER_KEYS = ("weights", "gradients", "optimizer", "transient")


@pytest.mark.parametrize("balance", ["aux-loss", "aux-free"])
@pytest.mark.parametrize("world", [2, 4], ids=["world2", "world4"])
def test_moe_training_equals_one_process_with_ledgers_and_traffic(world, balance, request):
    pool = request.getfixturevalue(f"pool{world}")
    config = TrainingConfig(**{**MOE.__dict__, "balance": balance})
    for layout in LAYOUTS[world]:
        run = run_training(pool, layout, config)
        ref = train_reference(config, layout.dp)
        assert run.against_reference(ref) < TOLERANCE, layout.label  # every loss and every final weight
        assert set(run.weights) == set(ref.weights)
        if balance == "aux-free":  # DeepSeek-V3's bias: the counts summed over the stage, moved the same way
            assert len(run.biases) == config.n_layers and all(torch.equal(a, b) for a, b in zip(run.biases,
                                                                                              ref.biases))
        for predicted, measured in zip(run.predicted_ledgers(), run.ledgers):
            assert {k: predicted[k] for k in LEDGER_KEYS} == {k: measured[k] for k in LEDGER_KEYS}, layout.label
            assert predicted["activations"] is None  # the experts keep what the router sent them
        assert run.traffic_mismatches() == [], layout.label
        if layout.ep > 1:
            axes = {k[0] for r in range(world) for k in run.traffic_by_axis(r)}
            assert {"ep", "stage", "edp"} <= axes


def test_the_ledger_splits_experts_routers_and_attention():
    config = TrainingConfig(dtype="float64", n_experts=4, experts_per_token=2)
    layout = Layout(tp=2, pp=1, dp=2, ep=4, dp_strategy="zero1")  # each rank one expert of each layer
    stage_layers = check_training(layout, config)
    row = predict_ledger(config, layout, stage_layers)[0]
    d, f, v, e = 32, 64, 64, 8
    attention = 4 * (d * 8 * (2 * 4 + 2 * 2) // 2)  # 4 layers of q, k, v, o (head_dim 8), split over tp 2
    expected = attention + 2 * v * d // 2 + 4 * 4 * d + 4 * 1 * 3 * d * f  # + embed, head / tp, routers, experts
    assert row["weights"] == expected * e
    # ZeRO-1 over dp 2 (attention, embedding, head), the stage's 4 ranks (routers), 1 holder (the experts)
    assert row["optimizer"] == 2 * e * ((attention + 2 * v * d // 2) // 2 + 4 * 4 * d // 4 + 4 * 3 * d * f)
    weights = init_weights(config)
    assert weights["layers.0.expert_gate"].shape == (4, f, d) and weights["layers.0.router"].shape == (4, d)


def test_dense_configs_are_unchanged():
    dense = TrainingConfig()
    assert not dense.is_moe and dense.model.n_experts == 1
    assert not any("expert" in k or "router" in k for k in init_weights(dense))


def test_bad_expert_layouts_are_refused_in_words():
    with pytest.raises(ValueError, match="ep = 3 does not divide the 4 experts of the toy language model: each rank"):
        check_training(Layout(tp=1, pp=1, dp=3, ep=3), MOE)
    with pytest.raises(ValueError, match=r"ep = 4 must divide the tp x dp x cp = 1 x 2 x 1 = 2 ranks of a stage"):
        check_training(Layout(tp=1, pp=2, dp=2, ep=4), MOE)
    with pytest.raises(ValueError, match="experts with ZeRO-3 are not combined"):
        check_training(Layout(tp=1, pp=1, dp=2, ep=2, dp_strategy="zero3"), MOE)
    with pytest.raises(ValueError, match="context-parallel ring"):
        check_training(Layout(tp=1, pp=1, dp=1, ep=2, cp=2), TrainingConfig(**{**MOE.__dict__, "seq": 16}))
    with pytest.raises(ValueError, match=r"ep = 2: the toy language model is dense \(n_experts = 1\)"):
        check_training(Layout(tp=1, pp=1, dp=2, ep=2), TrainingConfig())
    with pytest.raises(ValueError, match="each token cannot use 3 experts when there are only 2"):
        TrainingConfig(n_experts=2, experts_per_token=3)
    with pytest.raises(ValueError, match="balance"):
        TrainingConfig(n_experts=4, experts_per_token=2, balance="capacity")
