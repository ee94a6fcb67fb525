"""Every .cu of the course compiles with plain nvcc for Ampere and Hopper, without spills.

Kernel files are torch-free, so this needs only nvcc (CI has it, with no GPU). Where nvcc is
missing the test fails rather than skips under CI=true: a compile check that never runs is none.
"""

import json
import os
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch.utils import cpp_extension

import experiment_scripts
from mla_abi import MLA_BFLOAT16, MLA_FLOAT32
from mla_lab import check
from mla_lab.problem import Shape
from mla_lab.steps import EXERCISES_DIR, HOPPER_ARCH_FLAGS, KERNELS_DIR, REPO, SOLUTIONS_DIR, STEPS

SOURCES = sorted([*KERNELS_DIR.glob("*.cu"), *SOLUTIONS_DIR.glob("*.cu"), *EXERCISES_DIR.glob("*.cu")])
# torch's extension builds add these (no implicit half/bf16 conversions); compile as they do.
TORCH_NVCC_DEFINES = [f for f in cpp_extension.COMMON_NVCC_FLAGS if f.startswith("-D")]
ARCHS = ["-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90"]
# A step built only for some GPUs (step 6: sm_90a) is compiled for exactly those.
ARCHS_OF = {step.filename: list(step.arch_flags) for step in STEPS if step.arch_flags}


def toolkit_program(name: str, purpose: str, *elsewhere: str) -> str:
    """`name` from the CUDA toolkit (PATH, then $CUDA_HOME/bin) or one of `elsewhere`. Where there
    is none, the test fails under CI=true (a check that never runs is none) and is skipped elsewhere."""
    cuda_home = os.environ.get("CUDA_HOME")
    candidates = [shutil.which(name), cuda_home and os.path.join(cuda_home, "bin", name), *elsewhere]
    for path in candidates:
        if path and os.path.exists(path):
            return path
    if os.environ.get("CI"):
        pytest.fail(f"{name} is not on PATH in CI, so CI cannot {purpose}: every check here must run in CI")
    pytest.skip(f"{name} not found: install the CUDA toolkit to {purpose}")


def nvcc() -> str:
    return toolkit_program("nvcc", "compile the kernels")


def cuobjdump() -> str:
    """Also the copy that torch's triton dependency ships (the pip install has no toolkit's)."""
    try:
        import triton
        bundled = [os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")]
    except ImportError:
        bundled = []
    return toolkit_program("cuobjdump", "read the kernels' SASS", *bundled)


def wgmma_instructions(obj) -> int:
    """HGMMA instructions in an object's SASS: the wgmmas ptxas kept."""
    sass = subprocess.run([cuobjdump(), "-sass", str(obj)], capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"\bHGMMA\.", sass))


def test_there_are_sources():
    assert {p.parent.name for p in SOURCES} >= {"solutions", "exercises"}
    assert {p.name for p in SOURCES} >= {step.filename for step in STEPS}


def run_nvcc(source, arch_flags, output, *options):
    """nvcc as the course builds a step (C++17, -O3, torch's defines), with `options` such as -c or -ptx."""
    return subprocess.run(
        [nvcc(), *options, "-std=c++17", "-O3", f"-I{KERNELS_DIR}", *arch_flags, *TORCH_NVCC_DEFINES,
         str(source), "-o", str(output)],
        capture_output=True, text=True,
    )


def compile_with_ptxas_report(source, arch_flags, tmp_path, defines=()):
    return run_nvcc(source, arch_flags, tmp_path / "step.o", "-c", *defines, "-Xptxas", "-v")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_compiles_for_its_gpus_without_spills(source, tmp_path):
    result = compile_with_ptxas_report(source, ARCHS_OF.get(source.name, ARCHS), tmp_path)
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


STEP4_LAB = experiment_scripts.load("step4/lab.py")
STEP5_LAB = experiment_scripts.load("step5/lab.py")
STEP6_LAB = experiment_scripts.load("step6/lab.py")
STEP7_LAB = experiment_scripts.load("step7/lab.py")
STEP8_LAB = experiment_scripts.load("step8/lab.py")
STEP8_BULK_LAB = experiment_scripts.load("step8/bulk_lab.py")
TF32_LAB = experiment_scripts.load("tf32/lab.py")


@pytest.fixture(scope="module")
def step6_wgmma_instructions(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("step6")
    result = compile_with_ptxas_report(KERNELS_DIR / "06_hopper.cu", ARCHS_OF["06_hopper.cu"], tmp_path)
    assert result.returncode == 0, result.stderr
    return wgmma_instructions(tmp_path / "step.o")


@pytest.mark.parametrize("variant", [*sorted(STEP6_LAB.VARIANTS), "timeline+no_stg", "timeline+tma_store",
                                     "arrive_early+no_fence", "timeline+arrive_early+no_fence"])
def test_step6_lab_variants_still_apply_and_compile(variant, tmp_path, step6_wgmma_instructions):
    """experiments/step6/lab.py edits kernels/06_hopper.cu: each A/B variant in NOTES.md stays buildable
    (and the timeline marks on the variants NOTES.md follows phase by phase). Every variant keeps
    all the kernel's wgmmas: a timing-only copy whose results go unused let ptxas drop GEMM 2's
    (stop 21: `no_store` kept 9 of 24 and was read as the cost of the stores)."""
    switches = [f"-D{switch}" for switch in STEP6_LAB.switches_of(variant)]
    result = compile_with_ptxas_report(STEP6_LAB.lab_source(), ARCHS_OF["06_hopper.cu"], tmp_path, switches)
    assert result.returncode == 0, result.stderr
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", result.stderr)), result.stderr
    assert wgmma_instructions(tmp_path / "step.o") == step6_wgmma_instructions


def test_step6_lab_previous_kernel_still_builds(tmp_path):
    """The step 6 lab's "previous" (the kernel as its PREVIOUS_COMMIT had it) stays buildable."""
    result = compile_with_ptxas_report(STEP6_LAB.previous_source(), ARCHS_OF["06_hopper.cu"], tmp_path, [])
    assert result.returncode == 0, result.stderr


# "base" is the kernel itself, compiled above.
@pytest.mark.parametrize("lab, variant", [(lab, variant) for lab in (STEP4_LAB, STEP5_LAB, STEP7_LAB) for variant in sorted(lab.EDITS)],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_lab_variants_still_apply_and_compile(lab, variant, tmp_path):
    """experiments/step{4,5,7}/lab.py edit a kernel's text: each variant NOTES.md measured stays buildable."""
    result = compile_with_ptxas_report(lab.lab_source(variant), ARCHS, tmp_path)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("lab, variant", [(lab, variant) for lab in (STEP4_LAB, STEP5_LAB, STEP7_LAB)
                                          for variant in lab.VARIANTS if variant != "base" and variant not in lab.EDITS],
                         ids=lambda x: x if isinstance(x, str) else x.__name__)
def test_lab_kernels_from_earlier_commits_still_build(lab, variant, tmp_path):
    """A lab's "previous" and "at_<commit>" variants are a kernel file as an earlier commit had it
    (NOTES.md cites them, stop 23's reverted step 5 experiments among them), built against today's
    kernels/ headers: they stay buildable."""
    result = compile_with_ptxas_report(lab.lab_source(variant), ARCHS, tmp_path)
    assert result.returncode == 0, result.stderr


# "step7" is kernels/07_latency.cu itself, compiled above.
@pytest.mark.parametrize("variant", sorted(set(STEP8_LAB.VARIANTS) - {"step7"}))
def test_step8_experiment_and_its_lab_variants_compile_for_sm90_without_spills(variant, tmp_path):
    """experiments/step8/cluster.cu (sm_90: clusters, distributed shared memory) is no course step,
    so no other test compiles it: it and each variant its lab times (NOTES.md's "Step 8 experiment")
    stay buildable."""
    result = compile_with_ptxas_report(STEP8_LAB.lab_source(variant), ["-gencode=arch=compute_90,code=sm_90"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", result.stderr)), result.stderr


# "base" is kernels/08_bulk_mma.cu and "step7" kernels/07_latency.cu, both compiled above.
@pytest.mark.parametrize("variant", sorted(set(STEP8_BULK_LAB.VARIANTS) - {"base", "step7"}))
def test_step8_lab_variants_still_apply_and_compile_without_spills(variant, tmp_path):
    """experiments/step8/bulk_lab.py edits kernels/08_bulk_mma.cu: each variant NOTES.md measured
    stays buildable for sm_90."""
    result = compile_with_ptxas_report(STEP8_BULK_LAB.lab_source(variant), ARCHS_OF["08_bulk_mma.cu"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", result.stderr)), result.stderr


# Forms measured and not adopted, kept as patches that NOTES.md's reproduction commands apply:
# (patch, the kernel it edits, a line only the patched kernel has).
KEPT_PATCHES = [
    ("experiments/step8/tma_copies.patch", "kernels/08_bulk_mma.cu", "constexpr bool kTensorCopies = true;"),
    ("experiments/step6/wide_gemm1.patch", "kernels/06_hopper.cu", "template <int kPasses>"),
]


@pytest.mark.parametrize("patch_path, kernel_path, marker", KEPT_PATCHES, ids=lambda x: Path(x).name if "/" in x else x)
def test_kept_patches_still_apply_and_compile_without_spills(patch_path, kernel_path, marker, tmp_path):
    """experiments/step8/tma_copies.patch (stop 29) and experiments/step6/wide_gemm1.patch (stop 30)
    keep forms of steps 8 and 6 that were measured and not adopted (NOTES.md): each must still apply
    to the files it edits, and its kernel build for its GPUs without spills, or the reproduction
    commands in NOTES would not run."""
    patch = REPO / patch_path
    edited = re.findall(r"^\+\+\+ b/(\S+)$", patch.read_text(), re.M)
    assert kernel_path in edited
    for path in edited:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    applied = subprocess.run(["git", "apply", str(patch)], cwd=tmp_path, capture_output=True, text=True)
    assert applied.returncode == 0, applied.stderr
    patched = tmp_path / kernel_path
    assert marker in patched.read_text()
    result = compile_with_ptxas_report(patched, ARCHS_OF[Path(kernel_path).name], tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", result.stderr)), result.stderr


# "step5" is solutions/ex04_tensor_cores.cu and "base" kernels/09_tf32_wgmma.cu, both compiled above
# (the base's wgmmas are counted here too).
@pytest.mark.parametrize("variant", sorted(set(TF32_LAB.VARIANTS) - {"step5"}))
def test_steps_9_and_10_and_their_lab_variants_compile_for_sm90a_keeping_every_wgmma(variant, tmp_path):
    """Each variant experiments/tf32/lab.py times (NOTES.md's "Step 9 experiment" and "Three TF32
    passes") stays buildable without spills, and every GEMM kernel in it keeps its 4 wgmmas per
    32-deep stage (12 with three passes: hi*hi, hi*lo and lo*hi for each)."""
    result = compile_with_ptxas_report(TF32_LAB.lab_source(variant), HOPPER_ARCH_FLAGS, tmp_path)
    assert result.returncode == 0, result.stderr
    assert all(s == "0" for s in re.findall(r"(\d+) bytes spill stores", result.stderr)), result.stderr
    gemm_kernels = len(re.findall(r"Compiling entry function '\w*gemm_kernel", result.stderr))
    per_stage = 12 if variant in TF32_LAB.STEP_OF else 4
    assert gemm_kernels == 2 and wgmma_instructions(tmp_path / "step.o") == per_stage * gemm_kernels


# Run with no GPU visible, so that the launcher returns before touching one: cudaErrorNotSupported
# (801) where the shape exceeds its shared-memory budget, another error where it would go on.
_LAUNCH_CODES = r"""
import ctypes, json, sys
sys.path.insert(0, sys.argv[2])
from mla_abi import MlaProblem
launch = ctypes.CDLL(sys.argv[1]).mla_launch
launch.argtypes = [ctypes.POINTER(MlaProblem), ctypes.c_void_p]
codes = [launch(ctypes.byref(MlaProblem(None, None, None, None, None, 1, d, r, h, hd, dtype, None)), None)
         for d, r, h, hd, dtype in json.loads(sys.stdin.read())]
print(json.dumps(codes))
"""


def refusals_and_fits(source: Path, lab, shapes: list[tuple[int, int, int, int]], tmp_path):
    """For each (d_model, rank, heads, head_dim) of `shapes` in both dtypes: whether the launcher in
    `source` (compiled with nvcc, called with no GPU visible) refuses it, and whether `lab.fits`
    says it fits."""
    library = tmp_path / "launcher.so"
    result = run_nvcc(source, ["-gencode=arch=compute_90,code=sm_90"],
                      library, "-shared", "-Xcompiler", "-fPIC")
    assert result.returncode == 0, result.stderr
    cases = [(*shape, dtype) for shape in shapes for dtype in (MLA_FLOAT32, MLA_BFLOAT16)]
    run = subprocess.run([sys.executable, "-c", _LAUNCH_CODES, str(library), str(Path(__file__).parent)],
                         input=json.dumps(cases),
                         capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, check=True)
    refused = [code == 801 for code in json.loads(run.stdout)]
    fits = [lab.fits(Shape(1, 1, d, r, h, hd), 4 if dtype == MLA_FLOAT32 else 2) for d, r, h, hd, dtype in cases]
    return refused, fits


def test_step8_lab_runs_exactly_the_shapes_its_experiment_launches(tmp_path):
    """experiments/step8/lab.py picks the shapes to check by a copy of the kernel's shared-memory
    arithmetic (`fits`); the kernel's launcher refuses the others. The two must agree."""
    rng = random.Random(8)
    shapes = [(rng.randint(1, 3000), rng.randint(1, 600), rng.randint(1, 24), rng.randint(1, 160)) for _ in range(400)]
    shapes += [(s.d_model, s.rank, s.heads, s.head_dim) for s in (*STEP8_LAB.CHECKED, *check.SHAPE_MATRIX)]
    refused, fits = refusals_and_fits(REPO / "experiments" / "step8" / "cluster.cu", STEP8_LAB, shapes, tmp_path)
    assert refused == [not f for f in fits]
    assert any(refused) and not all(refused)


def test_step8_applies_exactly_where_its_launcher_takes_the_sizes(tmp_path):
    """`applies` (mla_lab/steps.py, through `bulk_mma_takes`, which experiments/step8/bulk_lab.py's
    `fits` asks) copies kernels/08_bulk_mma.cu's tests of the sizes and its shared-memory
    arithmetic; the launcher refuses the others before it asks the GPU anything, and mla_lab
    runs step 7 for them. The two must agree, at the shared-memory budget's edge too."""
    rng = random.Random(8)
    shapes = [(16 * rng.randint(1, 40) + rng.choice((0, 0, 8)), 16 * rng.randint(1, 40) + rng.choice((0, 0, 4)),
               rng.randint(1, 24), rng.choice((8, 16, 24, 32, 12, 7, 128))) for _ in range(300)]
    # rank 128, 2 x 64 columns: 128 bytes under the budget in fp32; rank 144 is over it
    shapes += [(256, 128, 2, 64), (256, 144, 2, 64), (512, 64, 2, 64), (512, 96, 2, 64)]
    shapes += [(s.d_model, s.rank, s.heads, s.head_dim) for s in (*STEP8_BULK_LAB.FITTING, *check.SHAPE_MATRIX)]
    refused, fits = refusals_and_fits(KERNELS_DIR / "08_bulk_mma.cu", STEP8_BULK_LAB, shapes, tmp_path)
    assert refused == [not f for f in fits]
    assert refused.count(True) > 50 and refused.count(False) > 50
