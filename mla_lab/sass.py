"""Each step's machine code (SASS), to prove that a change left what runs on the GPU as it was.

A rename, a moved file, a comment or a refactor of host-side Python should not change what the GPU
executes. `python -m mla_lab sass --against REV` compiles every step as the course builds it, at
REV (in a temporary git worktree, with REV's own registry) and in this checkout, disassembles both
with cuobjdump and says, step by step, whether the SASS is identical. Names that nvcc derives from
the file's path (kernels in an anonymous namespace) are normalised first, so a moved file compares
equal to itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from . import build

REPO = Path(__file__).resolve().parent.parent

# nvcc names an anonymous namespace after the file: _ZN<len>_GLOBAL__N__<hash>_<len>_<file>_cu_<hash>
_PATH_DERIVED = re.compile(r"_ZN\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_cu_[0-9a-f]{8}")
_ADDRESSES = re.compile(r"/\*[0-9a-f]{4,}\*/")

# Asks a checkout's own registry how it builds each step (older checkouts lack `defines`).
_REGISTRY = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from mla_lab import build, steps
print(json.dumps({s.number: {"source": str(s.source("solution")), "flags": [*build.STEP_CUDA_FLAGS, *s.arch_flags],
                             "defines": list(getattr(s, "defines", ()))} for s in steps.STEPS}))
"""

DEFAULT_ARCH = "-gencode=arch=compute_90,code=sm_90"


def cuobjdump() -> str:
    """cuobjdump from PATH, $CUDA_HOME/bin or the copy that torch's triton ships."""
    candidates = [shutil.which("cuobjdump"), os.environ.get("CUDA_HOME") and Path(os.environ["CUDA_HOME"]) / "bin" / "cuobjdump"]
    try:
        import triton

        candidates.append(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")
    except ImportError:
        pass
    for candidate in candidates:
        if candidate and Path(candidate).exists():
            return str(candidate)
    raise FileNotFoundError("cuobjdump not found: install the CUDA toolkit or put its bin/ on PATH")


def step_sass(source: Path, include_dir: Path, flags: list[str], defines: list[str], workdir: Path) -> str:
    """The normalised SASS of one step's .cu as the course builds it (an sm_90 build where the step
    names no architecture)."""
    archs = [f for f in flags if f.startswith("-gencode")] or [DEFAULT_ARCH]
    others = [f for f in flags if not f.startswith("-gencode")]
    obj = workdir / f"{source.stem}.{hashlib.sha1(' '.join(defines).encode()).hexdigest()[:6]}.o"
    compiler = build.nvcc()
    if compiler is None:
        raise FileNotFoundError("nvcc not found: install the CUDA toolkit or set CUDA_HOME")
    subprocess.run([compiler, "-c", *others, *archs, *build.torch_nvcc_defines(), *(f"-D{d}" for d in defines),
                    f"-I{include_dir}", str(source), "-o", str(obj)], check=True, capture_output=True, text=True)
    text = subprocess.run([cuobjdump(), "-sass", str(obj)], check=True, capture_output=True, text=True).stdout
    kept = [line for line in text.splitlines()
            if line.strip() and not line.startswith(("Fatbin", "code for", "identifier ="))]
    return _ADDRESSES.sub("", _PATH_DERIVED.sub("_ZN_ANONYMOUS_", "\n".join(kept)))


def registry_of(checkout: Path) -> dict[int, dict]:
    out = subprocess.run([sys.executable, "-c", _REGISTRY, str(checkout)], check=True, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(checkout)}, cwd=checkout)
    return {int(number): build for number, build in json.loads(out.stdout).items()}


def digests(checkout: Path = REPO) -> dict[int, str]:
    """Step number -> sha256 of its normalised SASS, for the checkout at `checkout`."""
    result = {}
    with tempfile.TemporaryDirectory() as work:
        for number, build in registry_of(checkout).items():
            sass = step_sass(Path(build["source"]), checkout / "kernels", build["flags"], build["defines"], Path(work))
            result[number] = hashlib.sha256(sass.encode()).hexdigest()[:12]
    return result


@contextlib.contextmanager
def worktree(rev: str, parent: Path | None = None):
    """A detached checkout of REV (a git worktree in a new folder under `parent`), removed afterwards."""
    with tempfile.TemporaryDirectory(dir=parent) as folder:
        tree = Path(folder) / "rev"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), rev], cwd=REPO, check=True,
                       capture_output=True)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)


def compare(rev: str) -> list[tuple[int, str, str]]:
    """(step, digest at rev, digest here) for every step either side has."""
    with worktree(rev) as tree:
        before = digests(tree)
    after = digests(REPO)
    return [(n, before.get(n, "-"), after.get(n, "-")) for n in sorted(set(before) | set(after))]
