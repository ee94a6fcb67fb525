"""Every .cu of the course compiles with plain nvcc for Ampere and Hopper, without spills.

Kernel files are torch-free, so this needs only nvcc (CI has it, with no GPU). Where nvcc is
missing the test fails rather than skips under CI=true: a compile check that never runs is none.
"""

import os
import re
import subprocess
from pathlib import Path

import pytest

from mla_lab import build, sass, steps
from mla_lab.steps import EXERCISES_DIR, KERNELS_DIR, REPO, SOLUTIONS_DIR, STEPS

SOURCES = sorted([*KERNELS_DIR.glob("*.cu"), *SOLUTIONS_DIR.glob("*.cu"), *EXERCISES_DIR.glob("*.cu")])
# torch's extension builds add these (no implicit half/bf16 conversions); compile as they do.
TORCH_NVCC_DEFINES = build.torch_nvcc_defines()
ARCHS = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]
# A step built only for some GPUs (step 6: sm_90a) is compiled for exactly those.
ARCHS_OF = {step.filename: list(step.arch_flags) for step in STEPS if step.arch_flags}
# Steps built from another step's file with definitions (step 10), compiled as such too.
DEFINED = [step for step in STEPS if step.defines]


def toolkit_program(find, name: str, purpose: str) -> str:
    """A CUDA tool, found as the course finds it (`find`). Where there is none, the test fails under
    CI=true (a check that never runs is none) and is skipped elsewhere."""
    try:
        found = find()
    except FileNotFoundError:
        found = None
    if found:
        return found
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not on PATH in CI, so CI cannot {purpose}: every check here must run in CI")
    pytest.skip(f"{name} not found: install the CUDA toolkit to {purpose}")


def nvcc() -> str:
    return toolkit_program(build.nvcc, "nvcc", "compile the kernels")


def cuobjdump() -> str:
    """Also the copy that torch's triton dependency ships (the pip install has no toolkit's)."""
    return toolkit_program(sass.cuobjdump, "cuobjdump", "read the kernels' SASS")


def wgmma_instructions(obj) -> int:
    """HGMMA instructions in an object's SASS: the wgmmas ptxas kept."""
    sass = subprocess.run([cuobjdump(), "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"\bHGMMA\.", sass))


def test_step_n_is_nn_name_in_every_folder():
    """A learner who knows the step number finds its file: kernels/NN_name.cu for a lecture step,
    solutions/NN_name.cu and exercises/NN_name.cu for an exercise step (exercise id exNN); no
    other .cu file is there."""
    expected = set()
    for step in STEPS:
        if step.built_from is None:
            assert step.filename == f"{step.number:02d}_{step.name}.cu"
        variants = ("solution", "exercise") if step.is_exercise else ("solution",)
        expected |= {step.source(variant) for variant in variants}
        if step.is_exercise:
            assert step.exercise == f"ex{step.number:02d}" and steps.get(step.exercise) is step
    assert set(SOURCES) == expected


def run_nvcc(source, arch_flags, output, *options):
    """nvcc as the course builds a step (C++17, -O3, torch's defines), with `options` such as -c or -ptx."""
    return subprocess.run(
        [nvcc(), *options, "-std=c++17", "-O3", f"-I{KERNELS_DIR}", *arch_flags, *TORCH_NVCC_DEFINES,
         str(source), "-o", str(output)],
        capture_output=True, text=True,
    )


def compile_with_ptxas_report(source, arch_flags, tmp_path, defines=()):
    return run_nvcc(source, arch_flags, tmp_path / "step.o", "-c", *defines, "-Xptxas", "-v")


BUILDS = [(source, ()) for source in SOURCES] + [(step.source(), tuple(f"-D{d}" for d in step.defines)) for step in DEFINED]


@pytest.mark.parametrize("source, defines", BUILDS, ids=lambda x: str(x.relative_to(REPO)) if isinstance(x, Path) else " ".join(x))
def test_compiles_for_its_gpus_without_spills(source, defines, tmp_path):
    result = compile_with_ptxas_report(source, ARCHS_OF.get(source.name, ARCHS), tmp_path, defines)
    assert result.returncode == 0, result.stderr
    spills = re.findall(r"(\d+) bytes spill stores", result.stderr)
    assert spills and all(s == "0" for s in spills), result.stderr
    # ptxas says so when it must serialize wgmma (a 2-3x slowdown that still computes right)
    assert "wgmma.mma_async instructions are serialized" not in result.stderr, result.stderr


# The GPUs a learner is likelier to have than an H200 (no such GPU is lent here, so this is all
# that is checked of them): consumer Ampere (sm_86) and Ada (sm_89) build every step that is not
# Hopper-only, without spills.
CONSUMER_ARCHS = ["-gencode=arch=compute_86,code=sm_86", "-gencode=arch=compute_89,code=sm_89"]


@pytest.mark.parametrize("source", [s for s in SOURCES if s.name not in ARCHS_OF],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_compiles_for_consumer_ampere_and_ada_without_spills(source, tmp_path):
    result = compile_with_ptxas_report(source, CONSUMER_ARCHS, tmp_path)
    assert result.returncode == 0, result.stderr
    spills = re.findall(r"(\d+) bytes spill stores", result.stderr)
    assert len(spills) >= 2 and all(s == "0" for s in spills), result.stderr


# A 16- or 8-byte store that nvcc split into 4-byte ones: back-to-back scalar stores in the PTX
# through one address register at offsets o and o + 4, o a multiple of 8 (kernels/mla_common.cuh,
# store_whole, says where it happened and what it cost). Scalar tail paths test each element first,
# so their stores are never back to back.
SCALAR_STORE = re.compile(r"^\s*st(?:\.global|\.shared)?\.(?:f32|u32|b32)\s+\[(%rd?\d+)(?:\+(\d+))?\]")


def split_stores(ptx: str) -> list[str]:
    found, previous = [], None
    for line in ptx.splitlines():
        match = SCALAR_STORE.match(line)
        store = (match.group(1), int(match.group(2) or 0)) if match else None
        if store and previous and store[0] == previous[0] and store[1] == previous[1] + 4 and previous[1] % 8 == 0:
            found.append(line.strip())
        previous = store
    return found


def test_split_stores_are_recognized():
    split = "\tst.global.f32 \t[%rd5], %f1;\n\tst.global.f32 \t[%rd5+4], %f2;\n"
    guarded = "\tst.global.f32 \t[%rd5], %f1;\n\tsetp.lt.s64 %p1, %rd2, %rd3;\n\tst.global.f32 \t[%rd5+4], %f2;\n"
    assert split_stores(split) == ["st.global.f32 \t[%rd5+4], %f2;"]
    assert split_stores(guarded) == []


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_vector_store_is_split_into_4_byte_stores(source, tmp_path):
    virtual = ARCHS_OF.get(source.name, ARCHS)[-1].replace("code=sm_", "code=compute_")
    ptx = tmp_path / "step.ptx"
    result = run_nvcc(source, [virtual], ptx, "-ptx")
    assert result.returncode == 0, result.stderr
    assert split_stores(ptx.read_text()) == []


@pytest.fixture(scope="module")
def hopper_objects(tmp_path_factory) -> dict[int, Path]:
    """Steps 6, 9 and 10 compiled for sm_90a, to count their wgmmas."""
    objects = {}
    for number in (6, 9, 10):
        step = steps.get(number)
        folder = tmp_path_factory.mktemp(f"step{number}")
        result = compile_with_ptxas_report(step.source(), step.arch_flags, folder, [f"-D{d}" for d in step.defines])
        assert result.returncode == 0, result.stderr
        objects[number] = folder / "step.o"
    return objects


def test_step6_runs_both_gemms_on_wgmma(hopper_objects):
    assert wgmma_instructions(hopper_objects[6]) > 0


@pytest.mark.parametrize("number, per_stage, gemm_kernels", [(9, 4, 3), (10, 12, 2)])
def test_steps_9_and_10_keep_every_wgmma(number, per_stage, gemm_kernels, hopper_objects):
    """Each GEMM kernel keeps its 4 wgmmas per 32-deep stage (12 with three passes: hi*hi, hi*lo and
    lo*hi for each): ptxas drops none. The kernels: one per tile and way of storing C (step 9:
    GEMM 1's tile storing TF32 or, split along k, partial sums, and GEMM 2's wider tile; step 10:
    one tile for both GEMMs, storing TF32 parts or sums)."""
    assert wgmma_instructions(hopper_objects[number]) == per_stage * gemm_kernels


GLOBAL_ACCESS = re.compile(r"\b(LDG|STG|LDGSTS|RED|ATOMG|UTMALDG|UTMASTG|UBLKCP)\b")


@pytest.mark.parametrize("number", [9, 10])
def test_steps_9_and_10_wait_for_the_kernel_before_them_before_touching_memory(number, hopper_objects):
    """Their kernels are launched as programmatic dependents: each may run while the one before it
    finishes, so each must wait (griddepcontrol.wait: ACQBULK in SASS) before its first global load
    or store, and let the next one start (launch_dependents: PREEXIT). A kernel that reads before
    its wait races with the kernel that writes what it reads, and a GPU test may not catch it."""
    sass = subprocess.run([cuobjdump(), "-sass", str(hopper_objects[number])], capture_output=True, text=True,
                          check=True).stdout
    functions = re.split(r"\n\s*Function : ", sass)[1:]
    assert len(functions) >= 4, "expected the transpose, split or sum, and GEMM kernels"
    for function in functions:
        name, body = function.split("\n", 1)
        wait = body.find("ACQBULK")
        first_access = GLOBAL_ACCESS.search(body)
        assert wait >= 0 and "PREEXIT" in body, f"{name} does not take part in the programmatic launch chain"
        assert first_access is None or first_access.start() > wait, f"{name} touches global memory before it waits"


def test_the_ctypes_problem_is_the_headers_struct(tmp_path):
    """mla_lab/abi.py's MlaProblem, which asks a step's library questions, has the C struct's layout."""
    import ctypes

    from mla_lab.abi import MlaProblem

    program = tmp_path / "layout.cpp"  # host code only: no CUDA runtime to link
    fields = [name for name, _ in MlaProblem._fields_]
    program.write_text('#include <stddef.h>\n#include <stdio.h>\n#include "mla_launch.h"\nint main() {\n'
                       '  printf("%zu", sizeof(MlaProblem));\n'
                       + "".join(f'  printf(" %zu", offsetof(MlaProblem, {name}));\n' for name in fields) + "}\n")
    subprocess.run([nvcc(), "-cudart", "none", "-I", str(KERNELS_DIR), str(program), "-o", str(tmp_path / "layout")], check=True)
    printed = subprocess.run([str(tmp_path / "layout")], capture_output=True, text=True, check=True).stdout.split()
    assert [int(n) for n in printed] == [ctypes.sizeof(MlaProblem), *(getattr(MlaProblem, n).offset for n in fields)]
