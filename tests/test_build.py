"""The build pipeline, on any machine with a CUDA build of torch and nvcc (no GPU needed)."""

import os
import subprocess
import sys
import time

import pytest
import torch

from mla_lab import build, steps, toolkit

needs_toolchain = pytest.mark.skipif(
    build.toolchain_problem() is not None and not os.environ.get("CI"),
    reason=str(build.toolchain_problem()),
)

BROKEN = """#include "mla_common.cuh"
extern "C" cudaError_t mla_launch(const MlaProblem* p, cudaStream_t s) {
  return undefined_name;
}
"""


def test_cpu_torch_is_named_in_one_line(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", None)
    problem = build.toolchain_problem()
    assert "CPU build" in problem and "\n" not in problem
    with pytest.raises(build.SetupProblem, match="CPU build"):
        build.build_step(steps.get(1).source(), "never_built")


def test_missing_nvcc_is_named_in_one_line_with_the_command_that_installs_it(monkeypatch):
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    for variable in toolkit.EXPLICIT:
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setattr(toolkit, "wheel_root", lambda: None)
    monkeypatch.setattr(toolkit.shutil, "which", lambda name: None)
    monkeypatch.setattr(toolkit, "nvcc_version", lambda home: None)  # nor one in /usr/local/cuda
    toolkit.compiler.cache_clear()
    try:
        problem = build.toolchain_problem()
    finally:
        toolkit.compiler.cache_clear()
    assert problem.startswith("no CUDA compiler") and "-m mla_lab toolkit install" in problem and "\n" not in problem


def test_setup_problems_render_as_one_line_in_jupyter():
    assert build.SetupProblem("no GPU")._render_traceback_() == ["SetupProblem: no GPU"]


@needs_toolchain
def test_binding_and_every_step_build_and_reject_cpu_tensors():
    from mla_lab.problem import TOY, make_inputs

    inputs = make_inputs(TOY)
    for step in steps.STEPS:
        for variant in ("solution", "exercise") if step.exercise else ("solution",):
            kernel = steps.load(step, variant)
            assert kernel.library.exists()
            with pytest.raises(RuntimeError, match="move the inputs there with .cuda()") as error:
                kernel(*inputs, TOY.heads)
            assert "\n" not in str(error.value).strip()


@needs_toolchain
def test_only_a_step_that_needs_gpu_scratch_exports_its_size():
    assert steps.load("hopper")._workspace_address != 0  # step 6's groups exchange latent slices
    assert steps.load("naive")._workspace_address == 0


@needs_toolchain
def test_compiler_errors_name_the_learners_file_and_line(tmp_path):
    source = tmp_path / "ex99_broken.cu"
    source.write_text(BROKEN)
    with pytest.raises(build.BuildError) as error:
        build.build_step(source, "mla_test_broken")
    output = error.value.compiler_output
    assert f"{source}(3): error" in output and "undefined_name" in output
    assert "FAILED:" not in output and "[1/" not in output
    assert error.value._render_traceback_()[0].startswith("ex99_broken.cu did not compile")


@needs_toolchain
def test_edit_then_rebuild_recompiles_only_the_step_in_the_same_process(tmp_path):
    source = tmp_path / "ex98_edit.cu"
    source.write_text(steps.get(1).source("solution").read_text())
    first = build.build_step(source, "mla_test_edit")
    binding_library = next(build.cache_dir().joinpath("mla_lab_binding").glob("*.so"))
    binding_mtime = binding_library.stat().st_mtime
    source.write_text(source.read_text() + "\n// an edit\n")
    started = time.perf_counter()
    second = build.build_step(source, "mla_test_edit")
    rebuild_s = time.perf_counter() - started
    assert second != first, "an edited source must load as a new library (no kernel restart)"
    assert binding_library.stat().st_mtime == binding_mtime
    print(f"rebuild after an edit: {rebuild_s:.1f} s")


@needs_toolchain
def test_a_stale_lock_from_an_interrupted_build_is_cleared(tmp_path):
    source = tmp_path / "ex97_lock.cu"
    source.write_text(steps.get(1).source("solution").read_text())
    build_dir = build.cache_dir() / "mla_test_lock"
    build_dir.mkdir(parents=True, exist_ok=True)
    (build_dir / "lock").write_text("")  # what a killed build leaves behind on torch <= 2.13
    started = time.perf_counter()
    assert build.build_step(source, "mla_test_lock").exists()
    assert time.perf_counter() - started < 120, "the build waited on the leftover lock"


@needs_toolchain
def test_two_processes_building_the_same_step_both_succeed(tmp_path):
    source = tmp_path / "ex96_race.cu"
    source.write_text(steps.get(2).source("solution").read_text())
    code = (
        "import sys; from pathlib import Path; from mla_lab import build; "
        f"print(build.build_step(Path({str(source)!r}), 'mla_test_race'))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [p.communicate(timeout=300) + (p.returncode,) for p in procs]
    assert all(rc == 0 for _, _, rc in results), results


@needs_toolchain
def test_inputs_that_require_grad_and_an_out_over_an_input_are_refused_in_one_line():
    from mla_lab.problem import TOY, make_inputs

    kernel = steps.load(1)
    inputs = make_inputs(TOY)
    trained = inputs._replace(w_down=inputs.w_down.clone().requires_grad_())
    with pytest.raises(RuntimeError, match=r"w_down requires grad, and these kernels have no backward; call them "
                                           r"under torch.no_grad\(\) or pass w_down.detach\(\)") as error:
        kernel(*trained, TOY.heads)
    assert "\n" not in str(error.value).strip()
    with torch.no_grad(), pytest.raises(RuntimeError, match="move the inputs there with .cuda()"):
        kernel(*trained, TOY.heads)  # no grad to keep: on to the next check
    storage = torch.empty(TOY.tokens * TOY.d_model + 2 * TOY.tokens * TOY.width)
    hidden = storage[: TOY.tokens * TOY.d_model].view(TOY.batch, TOY.seq, TOY.d_model)
    hidden.copy_(inputs.hidden)
    over_hidden = storage[TOY.tokens * TOY.d_model // 2:][: TOY.tokens * 2 * TOY.width].view(TOY.out_shape)
    with pytest.raises(RuntimeError, match="out overlaps hidden in memory"):
        kernel(hidden, inputs.w_down, inputs.w_up_k, inputs.w_up_v, TOY.heads, out=over_hidden)
