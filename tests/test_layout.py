import torch

from mla_lab import layout
from mla_lab.problem import Shape, make_inputs, reference


SHAPE = Shape(2, 3, 11, 5, 3, 4)


def test_offsets_match_torch_strides():
    out = torch.empty(SHAPE.out_shape)
    assert layout.stacked_strides(SHAPE) == out.stride()
    assert layout.stacked_offset(SHAPE, 1, 2, 1, 2, 3) == sum(
        i * s for i, s in zip((1, 2, 1, 2, 3), out.stride())
    )


def test_stack_is_one_gemm_against_concatenated_weights():
    x, wd, wk, wv = make_inputs(SHAPE, torch.float64, seed=3)
    latent = x.reshape(SHAPE.tokens, -1) @ wd
    one_gemm = (latent @ layout.concat_weights(wk, wv)).reshape(SHAPE.out_shape)
    torch.testing.assert_close(one_gemm, reference(x, wd, wk, wv, SHAPE.heads), rtol=0, atol=1e-12)


def test_concat_projection_writes_the_stacked_output_in_place():
    inputs = make_inputs(SHAPE, torch.float64, seed=4)
    out = torch.full(SHAPE.out_shape, float("nan"), dtype=torch.float64)
    w_cat = layout.concat_weights(inputs.w_up_k, inputs.w_up_v)
    result = layout.concat_projection(inputs.hidden, inputs.w_down, w_cat, SHAPE.heads, out)
    assert result.data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, reference(*inputs, SHAPE.heads))


def test_per_head_layout_is_a_column_permutation():
    x, wd, wk, wv = make_inputs(SHAPE, torch.float64, seed=5)
    latent = x.reshape(SHAPE.tokens, -1) @ wd
    per_head = (latent @ layout.per_head_weights(wk, wv, SHAPE.heads)).reshape(
        SHAPE.batch, SHAPE.seq, SHAPE.heads, 2, SHAPE.head_dim
    )
    torch.testing.assert_close(per_head.transpose(2, 3), reference(x, wd, wk, wv, SHAPE.heads))


def test_address_map_rows_are_k_heads_then_v_heads():
    codes = layout.address_map(SHAPE, tokens=2)
    assert codes.shape == (2, 2 * SHAPE.width)
    assert codes[0, layout.row_column(SHAPE, 1, 2, 0)] == 1 * SHAPE.heads + 2


def test_offset_grader_accepts_right_and_names_wrong_answers():
    shapes = [Shape(1, 2, 1, 1, 2, 3)]
    assert layout.grade_offset_function(layout.stacked_offset, shapes).startswith("correct on all 24")
    assert layout.grade_offset_function(lambda *a: NotImplemented, shapes).startswith("not implemented yet")
    def off_by_one_in_v(shape, b, s, kv, h, d):
        return layout.stacked_offset(shape, b, s, kv, h, d) + kv

    assert layout.grade_offset_function(off_by_one_in_v, shapes).startswith("wrong: out[0, 0, 1, 0, 0]")
