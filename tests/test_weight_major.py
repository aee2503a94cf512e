"""Weight-major matmuls (chat/engine/weights/weight_major.py): the same numbers as the model's own layers."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from chat.engine.weights import weight_major
from chat.engine.weights.weight_major import WeightMajorLinear


@pytest.mark.unit
@pytest.mark.parametrize("rows", [1, 2, 5, 16, 40])
def test_the_same_product_for_any_number_of_rows(rows):
    linear = nn.Linear(96, 320, bias=False)
    hidden = torch.randn(rows, 1, 96)  # [rows, one token, hidden], as a decode step feeds it
    expected = linear(hidden)
    got = WeightMajorLinear(linear)(hidden)
    assert got.shape == expected.shape
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.integration
def test_a_wrapped_model_decodes_the_same_logits_and_keeps_its_tied_head(float_backend):
    model = float_backend.model
    already = weight_major.unwrap_all(model)  # whatever start-up chose, compare against plain
    try:
        ids = torch.tensor([[11], [222], [3333]])  # 3 rows x 1 token: a decode step's shape
        with torch.inference_mode():
            plain = model(input_ids=ids).logits
            undo = weight_major.wrap(model)
            assert undo, "the model has bias-free linear layers to wrap"
            wrapped = model(input_ids=ids).logits
        torch.testing.assert_close(wrapped, plain, rtol=1e-3, atol=1e-3)
        head = model.get_output_embeddings()
        assert isinstance(head, WeightMajorLinear)
        if model.config.tie_word_embeddings:
            assert head.weight is model.get_input_embeddings().weight
        weight_major.unwrap(undo)
        assert type(model.get_output_embeddings()) is nn.Linear
    finally:
        if already:
            weight_major.wrap(model)


@pytest.mark.unit
def test_choose_keeps_weight_major_only_when_the_timed_step_is_faster():
    model = nn.Sequential(nn.Linear(8, 8, bias=False), nn.Linear(8, 8, bias=True))
    slower = iter([1.0, 2.0])  # plain 1 s, weight-major 2 s
    line = weight_major.choose(model, lambda: next(slower))
    assert "off" in line and type(model[0]) is nn.Linear
    faster = iter([2.0, 1.0])
    line = weight_major.choose(model, lambda: next(faster))
    assert "on" in line and isinstance(model[0], WeightMajorLinear)
    assert type(model[1]) is nn.Linear  # a layer with a bias is left alone
