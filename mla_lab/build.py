"""Building the binding and the kernel steps with torch.utils.cpp_extension and ninja.

Two kinds of library, each built by `torch.utils.cpp_extension.load` into a per-user cache keyed
by torch and CUDA version:
  * the binding (mla_lab/csrc/binding.cpp), a torch operator `torch.ops.mla_lab.project`, built
    once: torch's headers make it the slow part (about 20 s on two cores);
  * one plain-CUDA library per step (a .cu from kernels/, solutions/ or exercises/), about 5 s,
    rebuilt whenever its source changes, even inside a running notebook: the changed source gets a
    new library name, so no kernel restart is needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from . import toolkit

PACKAGE_DIR = Path(__file__).resolve().parent
BINDING_SOURCE = PACKAGE_DIR / "csrc" / "binding.cpp"
INCLUDE_DIR = PACKAGE_DIR.parent / "kernels"
CACHE_ENV = "MLA_LAB_CACHE"
# Architectures compiled for when no GPU is visible (CI, laptops): Ampere and Hopper.
DEFAULT_ARCHS = "8.0;9.0"
STEP_CUDA_FLAGS = ["-O3", "-lineinfo", "-std=c++17"]


class SetupProblem(RuntimeError):
    """Something outside the course code is missing (GPU, nvcc, a CUDA build of torch)."""

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a stack
        return [f"{type(self).__name__}: {self}"]


class BuildError(RuntimeError):
    """The compiler rejected a source file; `compiler_output` is what it said."""

    def __init__(self, source: Path, compiler_output: str) -> None:
        self.source = source
        self.compiler_output = compiler_output
        super().__init__(f"{source.name} did not compile:\n{compiler_output}")

    def _render_traceback_(self) -> list[str]:
        return [str(self)]


def toolchain_problem() -> str | None:
    """Why kernels cannot be built here, in one line, or None if they can."""
    if torch.version.cuda is None:
        return (
            f"this torch ({torch.__version__}) is a CPU build and cannot build CUDA kernels; "
            "install a CUDA build of torch (see README, What you need)"
        )
    if toolkit.compiler().problem:
        return toolkit.compiler().problem
    if shutil.which("ninja") is None and not _ninja_in_python():
        return "ninja was not found: pip install ninja"
    return None


def gpu_problem() -> str | None:
    """Why kernels cannot run here, in one line, or None if they can."""
    if torch.version.cuda is None or not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch"
    return None


def run_problem() -> str | None:
    """Why kernels cannot be built and run here, in one line, or None if they can."""
    return gpu_problem() or toolchain_problem()


def gpu_ready(what: str) -> bool:
    """For a notebook's GPU cell: True if it can run, else one line saying what it would show."""
    problem = run_problem()
    if problem:
        print(f"This cell needs a CUDA GPU ({problem}). On one it {what}; "
              "the stored-results cells print what the course measured.")
        return False
    return True


def setup_report() -> str:
    """What this machine can do for the course, a line per question."""
    lines = [
        f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none: a CPU build'})",
        f"compiler: {toolkit.compiler().line()}",
        f"kernels can be built here: {toolchain_problem() or 'yes, for ' + _target_archs_line()}",
    ]
    problem = gpu_problem()
    if problem:
        lines.append(f"kernels can run here: no; {problem}")
    else:
        props = torch.cuda.get_device_properties(0)
        lines.append(f"kernels can run here: yes, on {props.name} (sm_{props.major}{props.minor})")
    return "\n".join(lines)


def require_gpu() -> None:
    problem = run_problem()
    if problem:
        raise SetupProblem(problem)


def cache_dir() -> Path:
    root = Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "mla_lab")).expanduser()
    return root / f"torch-{torch.__version__}-cuda-{torch.version.cuda}"


@functools.cache
def binding():
    """`torch.ops.mla_lab.project`, building the binding the first time it is needed."""
    _load("mla_lab_binding", BINDING_SOURCE, with_cuda=True)
    return torch.ops.mla_lab.project


def preparer():
    """`torch.ops.mla_lab.prepare`: a step's own layout of the weights, made once (the same binding)."""
    binding()
    return torch.ops.mla_lab.prepare


def build_step(source: Path, name: str, arch_flags: tuple[str, ...] = (), defines: tuple[str, ...] = ()) -> Path:
    """Compile one step's .cu into its own library and return the library's path.

    arch_flags: nvcc's -gencode flags for a step that needs particular GPUs (step 6: sm_90a);
    without them, the GPU in use or, with none, DEFAULT_ARCHS. defines: NAME=VALUE for -D.
    """
    flags = [*STEP_CUDA_FLAGS, *arch_flags, *(f"-D{d}" for d in defines)]
    return Path(_load(name, source, extra_cuda_cflags=flags))


def _ninja_in_python() -> bool:
    return _cpp_extension().is_ninja_available()


@functools.cache
def _cpp_extension():
    """torch's extension builder, pointed at the compiler mla_lab.toolkit chose. torch's own guess
    (the folder above the first nvcc on PATH, else /usr/local/cuda) may be another CUDA version,
    or a wrapper's folder (/usr/local/bin/nvcc) where linking fails on -lcudart."""
    home = toolkit.compiler().home
    if home:
        os.environ["CUDA_HOME"] = home
    # Importing it without a GPU logs "No CUDA runtime is found"; toolchain_problem says what matters.
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    import torch.utils.cpp_extension

    if home and torch.utils.cpp_extension.CUDA_HOME != home:
        torch.utils.cpp_extension.CUDA_HOME = home  # imported earlier (by a test, say) with torch's guess
    return torch.utils.cpp_extension


def _target_archs_line() -> str:
    archs = [a for a in re.split(r"[;\s]+", _target_archs()) if a]
    return ", ".join(f"sm_{a.replace('.', '')}" for a in archs) + " (the Hopper steps: sm_90a)"


def _target_archs() -> str:
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    return DEFAULT_ARCHS


def _load(name: str, source: Path, **options) -> str:
    problem = toolchain_problem()
    if problem:
        raise SetupProblem(problem)
    build_dir = cache_dir() / name
    build_dir.mkdir(parents=True, exist_ok=True)
    with _exclusive(build_dir), _arch_list(_target_archs()):
        try:
            return _cpp_extension().load(
                name=name,
                sources=[str(source)],
                extra_include_paths=[str(INCLUDE_DIR)],
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=False,
                **options,
            )
        except RuntimeError as error:
            if "Error building extension" not in str(error):
                raise
            raise BuildError(source, compiler_lines(str(error))) from None


@contextlib.contextmanager
def _exclusive(build_dir: Path):
    """Serialize builds of one library across processes, and clear locks left by dead builds.

    torch <= 2.13 guards a build directory with a plain `lock` file and waits, forever, for it to
    vanish, so a build killed midway (a restarted notebook kernel) hangs every later one. Every
    mla_lab build first takes this flock, which the OS releases when its holder dies; while we
    hold it, such a `lock` file can only be a leftover and is safe to delete. (torch >= 2.14 holds
    an OS-level lock on that file instead: the file stays and means nothing.)
    """
    with open(build_dir / ".mla_lab.flock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if stale.exists() and not hasattr(_cpp_extension(), "FileLock"):
            logging.getLogger(__name__).warning("removed a stale build lock: %s", stale)
            stale.unlink()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _arch_list(archs: str):
    previous = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = archs
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = previous


# Architectures the grader compiles for where no GPU can run the kernel: Ampere and Hopper.
REPORT_ARCHS = ("-gencode=arch=compute_80,code=sm_80", "-gencode=arch=compute_90,code=sm_90")
_PTXAS_USAGE = re.compile(r"Used (\d+) registers.*?(?:(\d+) bytes smem)?$", re.M)
_PTXAS_SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def nvcc() -> str | None:
    """The nvcc the course builds with (mla_lab.toolkit), or None where there is none."""
    home = toolkit.compiler().home
    return str(Path(home) / "bin" / "nvcc") if home else None


def torch_nvcc_defines() -> list[str]:
    """The -D flags torch's extension builds add: no implicit half/bf16 conversions."""
    return [f for f in _cpp_extension().COMMON_NVCC_FLAGS if f.startswith("-D")]


def nvcc_flags(arch_flags: tuple[str, ...] = REPORT_ARCHS, defines: tuple[str, ...] = ()) -> list[str]:
    """nvcc's flags for a step as the course builds it, with -c and an output still to add."""
    return [*STEP_CUDA_FLAGS, *arch_flags, *torch_nvcc_defines(), *(f"-D{d}" for d in defines), f"-I{INCLUDE_DIR}"]


def compile_report(source: Path, arch_flags: tuple[str, ...] = (), defines: tuple[str, ...] = ()) -> tuple[bool, str]:
    """Compile one step's file with nvcc alone (no GPU, no torch build needed): (True, "compiles for
    sm_80 and sm_90: N registers, 0 spills, S bytes shared") or (False, the compiler's errors)."""
    compiler = nvcc()
    if compiler is None:
        return False, toolkit.compiler().problem or "no nvcc"
    archs = arch_flags or REPORT_ARCHS
    with tempfile.TemporaryDirectory() as folder:
        result = subprocess.run([compiler, "-c", *nvcc_flags(archs, defines), "-Xptxas", "-v", str(source),
                                 "-o", str(Path(folder) / "step.o")], capture_output=True, text=True)
    if result.returncode != 0:
        return False, compiler_errors(result.stderr)
    registers = [int(m[0]) for m in _PTXAS_USAGE.findall(result.stderr)]
    shared = [int(m[1] or 0) for m in _PTXAS_USAGE.findall(result.stderr)]
    spills = sum(int(a) + int(b) for a, b in _PTXAS_SPILLS.findall(result.stderr))
    targets = " and ".join(sorted({f"sm_{m}" for m in re.findall(r"code=sm_(\w+)", " ".join(archs))}))
    return True, (f"compiles for {targets}: {max(registers, default=0)} registers, {spills} bytes of spills, "
                  f"{max(shared, default=0)} bytes of static shared memory")


def compiler_errors(stderr: str) -> str:
    """nvcc's error lines (file(line): error: ...) with the detail lines indented under each."""
    kept, inside = [], False
    for line in stderr.splitlines():
        if re.search(r"\(\d+\): error", line) or line.startswith(("error", "nvcc fatal")):
            inside = True
            kept.append(line)
        elif inside and line.startswith((" ", "\t")) and line.strip():
            kept.append(line)
        else:
            inside = False
    return "\n".join(kept) or stderr.strip()


_NINJA_NOISE = re.compile(r"^(\[\d+/\d+\] |FAILED: |ninja: |Error building extension)")


def compiler_lines(ninja_output: str) -> str:
    """The compiler's own diagnostics from a failed ninja build, without ninja's command lines."""
    kept = [
        line
        for line in ninja_output.splitlines()
        if not _NINJA_NOISE.match(line) and not (" -c " in line and " -o " in line)
    ]
    return "\n".join(kept).strip() or ninja_output.strip()
