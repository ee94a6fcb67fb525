"""experiments/labkit.py, what the GPU labs share, where a CPU can check it: the step each variant
is built and checked as (so its tolerance), and a variant that fails its checks is left out of the
timings instead of stopping the lab."""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch

import experiment_scripts
from mla_lab import check, steps
from mla_lab.steps import REPO

sys.path.insert(0, str(REPO / "experiments"))
import labkit  # noqa: E402


def test_each_variant_is_built_as_its_step_and_one_that_fails_is_left_out(monkeypatch):
    one_pass = steps.Step(9, "one_pass", "TF32", "two_gemms.cu", fp32_math="tf32")
    three_passes = steps.Step(9, "three_passes", "fp32 from TF32", "two_gemms.cu")
    built = {}

    def build(step, source, library):
        built[library] = step.name
        return SimpleNamespace(name=library, fp32_math=step.fp32_math)

    def check_matrix(kernel, device, shapes, dtypes):
        return [SimpleNamespace(ok=kernel.name != "lab_wrong", tolerance=check.tolerance(kernel, torch.float32))]

    monkeypatch.setattr(labkit, "built_kernel", build)
    monkeypatch.setattr(labkit.check, "check_matrix", check_matrix)
    monkeypatch.setattr(labkit.check, "summary", lambda verdicts: "")
    monkeypatch.setattr(labkit.bench, "device_line", lambda: "")
    sources = {name: Path(f"{name}.cu") for name in ("base", "three", "wrong")}
    kept = labkit.build_and_check(one_pass, sources, list(sources), [], "lab", (torch.float32,),
                                  {"three": three_passes})
    assert built == {"lab_base": "one_pass", "lab_three": "three_passes", "lab_wrong": "one_pass"}
    assert set(kept) == {"base", "three"}
    assert check.tolerance(kept["three"], torch.float32) == 1e-5 < check.tolerance(kept["base"], torch.float32)


def test_the_tf32_lab_holds_its_three_pass_variants_to_fp32s_tolerance():
    lab = experiment_scripts.load("tf32/lab.py")
    assert set(lab.STEP_OF) & set(lab.CORRECT) == {"three_passes", "three_passes_gemm2_wide", "three_passes_promote_16",
                                                  "three_passes_row_by_row"}
    assert set(lab.STEP_OF) - set(lab.CORRECT) == {f"three_passes_{phase}" for phase in lab.PHASE_VARIANTS} | set(lab.INACCURATE)
    assert all(step.fp32_math == "fp32" for step in lab.STEP_OF.values()) and lab.STEP.fp32_math == "tf32"
    assert lab.STEP is steps.get(9) and set(lab.STEP_OF.values()) == {steps.get(10)}
    for name in lab.STEP_OF:
        assert "#define MLA_THREE_PASSES 1" in lab.lab_source(name).read_text()
    assert "#define MLA_THREE_PASSES 0" in lab.lab_source("base").read_text()

