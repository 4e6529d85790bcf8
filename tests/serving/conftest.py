"""Fixtures of the tests that check the engine against a ``transformers`` model: each such module gives its own
``hf_model``; these read it into the engine's weights and take its greedy tokens on the exactness trace."""

import pytest

from shardlib.core.checkpoints import weights_from_hf
from shardlib.lab.serving.hf import hf_greedy_tokens
from shardlib.lab.serving.traces import every_other_shared_trace


@pytest.fixture(scope="module")
def hf_weights(hf_model):
    """The engine's weights, read from the module's ``transformers`` model."""
    return weights_from_hf(hf_model.state_dict(), hf_model.config)


@pytest.fixture(scope="module")
def generated(hf_model):
    """``transformers``' greedy tokens for each request of ``every_other_shared_trace()``."""
    return hf_greedy_tokens(hf_model, every_other_shared_trace())
