import pytest
import torch

from mla_lab import problem
from mla_lab.problem import TOY, Shape, make_inputs, oracle, reference


def test_presets_have_the_model_dimensions():
    assert (TOY.batch, TOY.seq, TOY.d_model, TOY.rank, TOY.heads, TOY.head_dim) == (4, 96, 256, 48, 4, 32)
    v2 = problem.preset("v2_lite", 2, 1024)
    assert (v2.tokens, v2.d_model, v2.rank, v2.heads, v2.head_dim) == (2048, 2048, 512, 16, 128)
    v3 = problem.preset("v3")
    assert (v3.d_model, v3.rank, v3.heads, v3.head_dim) == (7168, 512, 128, 128)
    with pytest.raises(ValueError, match="unknown preset"):
        problem.preset("v4")


def test_shape_rejects_nonsense():
    with pytest.raises(ValueError, match="rank"):
        Shape(1, 1, 8, 0, 1, 1)


def test_reference_matches_the_operator_written_out_by_hand():
    shape = Shape(2, 3, 10, 4, 3, 5)
    x, wd, wk, wv = make_inputs(shape, torch.float64, seed=1)
    out = reference(x, wd, wk, wv, heads=3)
    assert out.shape == (2, 3, 2, 3, 5)
    for b in range(2):
        for s in range(3):
            latent = x[b, s] @ wd
            for h in range(3):
                cols = slice(h * 5, (h + 1) * 5)
                torch.testing.assert_close(out[b, s, 0, h], latent @ wk[:, cols])
                torch.testing.assert_close(out[b, s, 1, h], latent @ wv[:, cols])


def test_heads_is_not_inferred_from_the_weights():
    shape = Shape(1, 2, 8, 4, 2, 6)
    inputs = make_inputs(shape, torch.float64)
    assert reference(*inputs, heads=2).shape == (1, 2, 2, 2, 6)
    assert reference(*inputs, heads=3).shape == (1, 2, 2, 3, 4)


def test_inputs_are_seeded_and_unit_scale():
    a = make_inputs(problem.preset("v2_lite", 1, 64), seed=7)
    b = make_inputs(problem.preset("v2_lite", 1, 64), seed=7)
    c = make_inputs(problem.preset("v2_lite", 1, 64), seed=8)
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert not torch.equal(a.hidden, c.hidden)
    out = oracle(a, 16)
    assert 0.8 < float(out.std()) < 1.2, "outputs must be O(1) so bf16 neither overflows nor hides errors"
    bf16 = make_inputs(TOY, torch.bfloat16, seed=7)
    assert bf16.hidden.dtype == torch.bfloat16


def test_flop_and_byte_counts():
    shape = Shape(1, 10, 6, 3, 2, 4)  # tokens 10, width 8
    assert shape.flops() == 2 * 10 * 3 * (6 + 16)
    elements = 10 * 6 + 6 * 3 + 2 * 3 * 8 + 10 * 16
    assert shape.min_bytes(torch.float32) == 4 * elements
    assert shape.min_bytes(torch.bfloat16) == 2 * elements
