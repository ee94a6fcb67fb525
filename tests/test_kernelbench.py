"""The KernelBench-format problem: its interface on CPU, every step's ModelNew on the GPU."""

import pytest
import torch

from mla_lab import kernelbench, steps
from mla_lab.problem import TOY, reference
from mla_lab.steps import KERNELS_DIR

PROBLEM_FILE = KERNELS_DIR / "kernelbench_mla.py"


def test_problem_file_has_the_kernelbench_interface():
    module = kernelbench.load_file(PROBLEM_FILE)
    assert {"Model", "ModelNew", "get_inputs", "get_init_inputs"} <= set(dir(module))
    assert module.get_init_inputs() == [TOY.heads]
    hidden, w_down, w_up_k, w_up_v = module.get_inputs()
    assert hidden.shape == (4, 96, 256) and w_down.shape == (256, 48)
    assert w_up_k.shape == w_up_v.shape == (48, 128)
    assert hidden.dtype == torch.float32 and hidden.device.type == "cpu"


def test_model_is_the_reference_and_inputs_follow_the_global_seed():
    torch.manual_seed(0)
    first = kernelbench.get_inputs()
    torch.manual_seed(0)
    again = kernelbench.get_inputs()
    torch.manual_seed(1)
    other = kernelbench.get_inputs()
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert not torch.equal(first[0], other[0])
    model = kernelbench.Model(*kernelbench.get_init_inputs())
    torch.testing.assert_close(model(*first), reference(*first, TOY.heads), rtol=0, atol=0)


def test_there_is_a_model_new_per_step_chosen_by_name():
    for step in steps.STEPS:
        cls = kernelbench.model_new(step.name)
        assert cls.step_name == step.name and issubclass(cls, kernelbench.Model)
    with pytest.raises(ValueError, match="no step"):
        kernelbench.model_new("fastest")


@pytest.mark.gpu
@pytest.mark.parametrize("step", [s.name for s in steps.STEPS])
def test_every_steps_model_new_passes_the_kernelbench_evaluation(step, monkeypatch):
    monkeypatch.setenv("MLA_LAB_STEP", step)
    # A TF32 step is not fp32-accurate (allclose 1e-4 rightly fails it there); judge it in bf16.
    dtype = torch.bfloat16 if steps.get(step).fp32_math == "tf32" else torch.float32
    line = kernelbench.evaluate(PROBLEM_FILE, trials=3, timing_trials=20, dtype=dtype)
    assert ": correct on 3/3 trials" in line, line
