"""Weights prepared once (`Kernel.prepare`, `mla_lab.prepare`): which steps have a layout of their
own, and the one-line errors when prepared weights do not belong to the call. On any machine with a
CUDA build of torch; the GPU side is in tests/test_gpu.py."""

import pytest

from mla_lab import steps
from mla_lab.problem import TOY, make_inputs


def test_only_the_steps_that_transpose_the_weights_prepare_them():
    assert [s.number for s in steps.STEPS if steps.load(s.number).prepares_weights] == [9, 10]


def test_a_step_that_reads_the_weights_as_they_are_says_so():
    with pytest.raises(ValueError, match="step 6 .* reads the weights as they are, so it has nothing to prepare"):
        steps.load(6).prepare(*make_inputs(TOY)[1:], TOY.heads)


def test_preparing_weights_off_the_gpu_is_one_line_naming_the_fix():
    with pytest.raises(RuntimeError, match=r"step 10 \(three_passes\): w_down is on cpu; .*\.cuda\(\)") as error:
        steps.load(10).prepare(*make_inputs(TOY)[1:], TOY.heads)
    assert "\n" not in str(error.value).strip()


def prepared_for(step: int, weights, heads: int = TOY.heads) -> steps.PreparedWeights:
    """What Kernel.prepare returns, without a GPU to run it (the layout itself is not needed here)."""
    return steps.PreparedWeights(steps.get(step), None, tuple(weights), tuple(w._version for w in weights), heads)


@pytest.mark.parametrize("case, message", [
    ("another step", r"prepared by step 9 \(tf32_wgmma\), whose layout differs; prepare them with step 10"),
    ("another tensor", r"w_up_k is not the tensor these weights were prepared from; pass the very tensors"),
    ("edited in place", r"w_up_v was changed in place after it was prepared; prepare again"),
    ("other heads", r"prepared for heads=4, not 2; prepare again"),
])
def test_prepared_weights_that_do_not_belong_to_the_call_are_refused_before_it_runs(case, message):
    hidden, *weights = make_inputs(TOY)
    prepared = prepared_for(9 if case == "another step" else 10, weights)
    heads = 2 if case == "other heads" else TOY.heads
    if case == "another tensor":
        weights[1] = weights[1].clone()
    if case == "edited in place":
        weights[2].mul_(1.0)
    with pytest.raises(ValueError, match=message) as error:
        steps.load(10)(hidden, *weights, heads, prepared=prepared)  # CPU tensors: no launch would run
    assert "\n" not in str(error.value)


def test_the_dispatcher_has_nothing_to_prepare_in_bf16_or_past_rank_512():
    """Decided from dtype and rank before any GPU is asked (the sweep asks it at every point)."""
    import torch

    from mla_lab import dispatch

    assert not dispatch.has_layout_to_prepare(torch.empty(8, 64, dtype=torch.bfloat16))
    assert not dispatch.has_layout_to_prepare(torch.empty(8, 520))
