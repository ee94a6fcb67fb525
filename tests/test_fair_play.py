"""The grader's fair-play checks (mla_lab.fair_play), fed planted kernels on the CPU."""

import torch

from mla_lab import TOY, check, fair_play, problem

SHAPE = TOY.with_tokens(1, 5)


class Planted:
    """A kernel that computes the right answer, then does `after(call number, inputs, out)`."""

    writes_into_out = True
    fp32_math = "fp32"

    def __init__(self, after=None):
        self.after, self.calls, self.kept = after, 0, None

    def __call__(self, hidden, w_down, w_up_k, w_up_v, heads, out):
        self.calls += 1
        result = problem.reference(hidden, w_down, w_up_k, w_up_v, heads)
        out.copy_(result)
        if self.after:
            self.after(self, (hidden, w_down, w_up_k, w_up_v), out)
        return out


def test_a_fair_kernel_passes_every_cpu_check():
    for dtype in (torch.float32, torch.bfloat16):
        assert fair_play.inputs_untouched(Planted(), SHAPE, dtype, "cpu") is None
        assert fair_play.output_not_carried_over(Planted(), SHAPE, dtype, "cpu") is None


def test_a_kernel_that_writes_an_input_is_named_with_the_input():
    def clobber(kernel, inputs, out):
        inputs[2][0, 0] = 0.0

    line = fair_play.inputs_untouched(Planted(clobber), SHAPE, torch.float32, "cpu")
    assert line.startswith("modified its inputs (w_up_k)") and "\n" not in line


def test_a_kernel_that_keeps_its_first_output_is_caught():
    def keep_first(kernel, inputs, out):
        if kernel.kept is None:
            kernel.kept = out.clone()
        out.copy_(kernel.kept)

    line = fair_play.output_not_carried_over(Planted(keep_first), SHAPE, torch.float32, "cpu")
    assert line.startswith("returned the first call's output")


def test_a_kernel_that_skips_a_repeated_call_is_caught():
    def skip_second(kernel, inputs, out):
        if kernel.calls > 1:
            out.fill_(float("nan"))

    line = fair_play.output_not_carried_over(Planted(skip_second), SHAPE, torch.float32, "cpu")
    assert line.startswith("wrote nothing on a second call")


def test_a_time_below_the_roofline_floor_is_flagged_not_celebrated():
    assert fair_play.faster_than_floor(2.0, 1.5) is None
    assert fair_play.faster_than_floor(2.0, None) is None
    line = fair_play.faster_than_floor(0.8, 1.5)
    assert "below the roofline floor of 1.50 us" in line and "\n" not in line


def test_an_fp32_error_the_size_of_tf32s_is_named():
    assert "what TF32 gives" in fair_play.precision_note(torch.float32, 4e-4, "fp32")
    assert fair_play.precision_note(torch.float32, 4e-4, "tf32") == ""
    assert fair_play.precision_note(torch.float32, 1e-1, "fp32") == ""
    assert fair_play.precision_note(torch.bfloat16, 4e-4, "fp32") == ""
    # the same size of error from emulated one-pass TF32 products, as a TF32 step would give
    inputs = problem.make_inputs(SHAPE, torch.float32)
    rounded = [check.tf32_round(t) for t in inputs]
    latent = check.tf32_round(rounded[0].reshape(-1, SHAPE.d_model) @ rounded[1])
    got = torch.cat([latent @ rounded[2], latent @ rounded[3]], dim=1)
    expected = problem.oracle(inputs, SHAPE.heads).reshape(SHAPE.tokens, 2 * SHAPE.width)
    error = float((got.double() - expected).norm() / expected.norm())
    assert "what TF32 gives" in fair_play.precision_note(torch.float32, error, "fp32")

