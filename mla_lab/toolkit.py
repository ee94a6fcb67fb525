"""The CUDA compiler the course builds with: by default NVIDIA's pip wheels of the CUDA version
torch was built with, so that a machine needs only Python and the NVIDIA driver.

torch's CUDA build brings the runtime libraries; `cuda-toolkit[nvcc,cccl]` of the same
major.minor brings nvcc, ptxas, cicc and the headers into site-packages/nvidia/cu<major>/. torch's
extension builder expects a toolkit's layout there: it links `-lcudart` from `$CUDA_HOME/lib64`,
where the wheels have `lib/` holding only `libcudart.so.<major>`. A folder of links inside the
environment (`<sys.prefix>/mla_lab_cuda`) closes both gaps, and the build points CUDA_HOME at it.

A system toolkit is used where the learner asks for it (MLA_LAB_CUDA_HOME, or CUDA_HOME / CUDA_PATH)
or where no wheels are installed and the nvcc on PATH (conda's cuda-nvcc), else /usr/local/cuda, is
torch's CUDA version: never one of another version, which would build against the wrong runtime.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import site
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

SHIM = Path(sys.prefix) / "mla_lab_cuda"
EXPLICIT = ("MLA_LAB_CUDA_HOME", "CUDA_HOME", "CUDA_PATH")


def torch_cuda() -> str | None:
    """The CUDA major.minor torch was built with ("13.0"), or None for a CPU build."""
    return torch.version.cuda


def requirement() -> str:
    """The pip requirement for the compiler that matches torch: cuda-toolkit[nvcc,cccl]==13.0.*."""
    return f"cuda-toolkit[nvcc,cccl]=={torch_cuda()}.*"


def install_command() -> str:
    return f"{Path(sys.executable).name} -m mla_lab toolkit install"


@dataclass(frozen=True)
class Compiler:
    home: str | None  # the folder to use as CUDA_HOME (bin/nvcc, include, lib64)
    origin: str  # "pip wheels", "system (CUDA_HOME)", ...; "" where there is none
    version: str | None  # nvcc's release, "13.0.88"
    problem: str | None  # why the course cannot build here, with the command that fixes it

    def line(self) -> str:
        if self.problem:
            return self.problem
        return f"nvcc {self.version} from {self.origin} ({self.home})"


def nvcc_version(home: str | Path) -> str | None:
    """nvcc's full release ("13.0.88") under `home`, or None if it has no working nvcc."""
    nvcc = Path(home) / "bin" / "nvcc"
    if not nvcc.exists():
        return None
    try:
        out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"release [\d.]+, V([\d.]+)", out)
    return found[1] if found else None


def _same_release(version: str | None, cuda: str | None) -> bool:
    return cuda is None or (version is not None and version.split(".")[:2] == cuda.split(".")[:2])


def _site_packages() -> list[Path]:
    folders = [*site.getsitepackages(), sysconfig.get_paths()["purelib"]]
    if site.ENABLE_USER_SITE:
        folders.append(site.getusersitepackages())
    return [Path(f) for f in dict.fromkeys(folders)]


def wheel_root() -> Path | None:
    """site-packages/nvidia/cu<major> holding the wheels' nvcc, for torch's CUDA major."""
    cuda = torch_cuda()
    if cuda is None:
        return None
    for folder in _site_packages():
        root = folder / "nvidia" / f"cu{cuda.split('.')[0]}"
        if (root / "bin" / "nvcc").exists():
            return root
    return None


def make_shim(root: Path, shim: Path = SHIM) -> Path:
    """The wheels under a toolkit's layout: bin, include and nvvm link to the wheels' own, lib64
    holds a link per library and libcudart.so. Links only, made again if the wheels moved."""
    shim.mkdir(parents=True, exist_ok=True)
    for name in ("bin", "include", "nvvm"):
        link = shim / name
        if link.is_symlink() and link.resolve() != (root / name).resolve():
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(root / name, target_is_directory=True)
    lib64 = shim / "lib64"
    lib64.mkdir(exist_ok=True)
    for library in (root / "lib").iterdir():
        link = lib64 / library.name
        if link.is_symlink() and link.resolve() != library.resolve():
            link.unlink()
        if not link.exists():
            link.symlink_to(library)
    cudart = sorted((root / "lib").glob("libcudart.so.*"))
    unversioned = lib64 / "libcudart.so"
    if cudart and not unversioned.exists():
        unversioned.symlink_to(cudart[0])
    return shim


def _system_home(nvcc: str) -> Path | None:
    """The toolkit folder of an nvcc on PATH, which may be a link or a wrapper script
    (/usr/local/bin/nvcc): nvcc itself says where it runs from (`--dryrun` prints TOP=...)."""
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "empty.cu"
        source.write_text("")
        try:
            out = subprocess.run([nvcc, "--dryrun", "-c", str(source), "-o", str(source.with_suffix(".o"))],
                                 capture_output=True, text=True, timeout=60).stderr
        except (OSError, subprocess.TimeoutExpired):
            return None
    top = re.search(r"^#\$ TOP=(.+)$", out, re.M)
    home = Path(top[1].strip()).resolve() if top else Path(nvcc).resolve().parent.parent
    return home if (home / "include" / "cuda_runtime.h").exists() else None


@functools.cache
def compiler() -> Compiler:
    """The compiler the course uses here, or why there is none (see the module's docstring)."""
    cuda = torch_cuda()
    fix = f"`{install_command()}` installs the compiler of torch's CUDA {cuda}"
    for variable in EXPLICIT:
        home = os.environ.get(variable)
        if home and Path(home).resolve() == SHIM.resolve():
            continue  # set by this module for torch's builder (and inherited): the wheels, below
        if home:
            version = nvcc_version(home)
            if version is None:
                return Compiler(None, "", None, f"{variable}={home} holds no working bin/nvcc: correct it, "
                                                f"or unset it and run `{install_command()}`")
            if not _same_release(version, cuda):
                return Compiler(None, "", version, f"{variable}={home} is CUDA {version}, torch is built with "
                                                   f"CUDA {cuda}: point it at a CUDA {cuda} toolkit, or unset it "
                                                   f"and run `{install_command()}`")
            return Compiler(home, f"system ({variable})", version, None)
    root = wheel_root()
    if root is not None:
        shim = make_shim(root)
        return Compiler(str(shim), "pip wheels", nvcc_version(shim), None)
    on_path = shutil.which("nvcc")
    home = _system_home(on_path) if on_path else None
    if home is not None:
        version = nvcc_version(home)
        if _same_release(version, cuda):
            return Compiler(str(home), "system (PATH)", version, None)
        return Compiler(None, "", version, f"the nvcc on PATH is CUDA {version}, torch is built with CUDA {cuda}: "
                                           f"{fix} (or set MLA_LAB_CUDA_HOME to a CUDA {cuda} toolkit)")
    # Where a toolkit's bin/ is not on PATH (GPU images often leave it out): its usual folder, of
    # torch's version only.
    usual = Path("/usr/local/cuda")
    version = nvcc_version(usual)
    if version is not None and _same_release(version, cuda):
        return Compiler(str(usual), f"system ({usual})", version, None)
    if cuda is None:
        return Compiler(None, "", None, "no nvcc: a CPU build of torch has no CUDA version to match; install "
                                        "torch's CUDA build (README, What you need), then run `" + install_command() + "`")
    return Compiler(None, "", None, f"no CUDA compiler: {fix}")


def install() -> int:
    """pip-install the compiler wheels that match torch, then lay out their toolkit folder."""
    cuda = torch_cuda()
    if cuda is None:
        print("torch is a CPU build: install its CUDA build first (README, What you need); it names the CUDA version "
              "whose compiler this installs", file=sys.stderr)
        return 2
    result = subprocess.run([sys.executable, "-m", "pip", "install", "-q", requirement()])
    if result.returncode != 0:
        return result.returncode
    root = wheel_root()
    if root is None:
        print(f"pip installed {requirement()}, but no nvidia/cu{cuda.split('.')[0]}/bin/nvcc is in "
              "site-packages", file=sys.stderr)
        return 1
    shim = make_shim(root)
    print(f"nvcc {nvcc_version(shim)} from pip wheels, laid out as a toolkit in {shim}")
    return 0
