"""The CUDA compiler the course builds with: pip's wheels of torch's CUDA version, a system toolkit
only where asked for and of that version (mla_lab/toolkit.py)."""

import os
import re
import stat

import pytest
import torch

from mla_lab import build, toolkit
from mla_lab.steps import REPO


@pytest.fixture
def fresh_choice(monkeypatch):
    """toolkit.compiler() chosen again under this test's environment, and again after it."""
    for variable in toolkit.EXPLICIT:
        monkeypatch.delenv(variable, raising=False)
    toolkit.compiler.cache_clear()
    yield
    toolkit.compiler.cache_clear()


def fake_toolkit(folder, release: str):
    """A folder with a bin/nvcc that answers --version as a CUDA `release` nvcc does."""
    nvcc = folder / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.77'\n")
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return folder


def test_the_wheels_are_laid_out_as_a_toolkit_by_links_only(tmp_path):
    root = fake_toolkit(tmp_path / "nvidia" / "cu13", "13.0")
    (root / "include").mkdir()
    (root / "nvvm").mkdir()
    (root / "lib").mkdir()
    (root / "lib" / "libcudart.so.13").write_text("")
    (root / "lib" / "libnvrtc.so.13").write_text("")
    shim = toolkit.make_shim(root, tmp_path / "shim")
    assert (shim / "bin" / "nvcc").resolve() == (root / "bin" / "nvcc").resolve()
    assert (shim / "lib64" / "libcudart.so").resolve() == (root / "lib" / "libcudart.so.13").resolve()
    assert (shim / "lib64" / "libnvrtc.so.13").is_symlink()
    assert sorted(p.name for p in (root / "lib").iterdir()) == ["libcudart.so.13", "libnvrtc.so.13"]  # untouched
    assert toolkit.make_shim(root, tmp_path / "shim") == shim  # again: nothing to do, no error
    assert toolkit.nvcc_version(shim) == "13.0.77"


def test_a_toolkit_of_another_cuda_version_is_refused_with_the_fix(tmp_path, monkeypatch, fresh_choice):
    monkeypatch.setattr(toolkit, "torch_cuda", lambda: "13.0")
    monkeypatch.setenv("MLA_LAB_CUDA_HOME", str(fake_toolkit(tmp_path / "cuda-12.4", "12.4")))
    chosen = toolkit.compiler()
    assert chosen.home is None
    assert "is CUDA 12.4.77, torch is built with CUDA 13.0" in chosen.problem
    assert "toolkit install" in chosen.problem


def test_a_toolkit_the_learner_names_is_used_when_its_version_matches(tmp_path, monkeypatch, fresh_choice):
    monkeypatch.setattr(toolkit, "torch_cuda", lambda: "13.0")
    home = fake_toolkit(tmp_path / "cuda-13.0", "13.0")
    monkeypatch.setenv("CUDA_HOME", str(home))
    chosen = toolkit.compiler()
    assert (chosen.home, chosen.origin, chosen.problem) == (str(home), "system (CUDA_HOME)", None)


def test_the_requirement_follows_torchs_cuda_version(monkeypatch):
    monkeypatch.setattr(toolkit, "torch_cuda", lambda: "12.8")
    assert toolkit.requirement() == "cuda-toolkit[nvcc,cccl]==12.8.*"


@pytest.mark.skipif(not os.environ.get("MLA_LAB_EXPECT_WHEELS"), reason="CI hides the system toolkit (.ci/run)")
def test_with_the_system_toolkit_hidden_the_course_builds_with_the_wheels():
    chosen = toolkit.compiler()
    assert chosen.origin == "pip wheels", chosen.line()
    assert chosen.version.startswith(f"{torch.version.cuda}."), chosen.line()
    assert build.nvcc() == str(toolkit.SHIM / "bin" / "nvcc")
    assert build.toolchain_problem() is None


def test_doctor_says_which_compiler_and_for_which_architectures():
    report = build.setup_report()
    assert re.search(r"^compiler: ", report, re.M), report
    if build.toolchain_problem() is None:
        assert "kernels can be built here: yes, for sm_" in report


@pytest.mark.skipif(torch.version.cuda is None, reason="a CPU build of torch names no CUDA version")
def test_the_conda_route_names_torchs_cuda_version():
    pinned = re.search(r"^  - cuda-version=([\d.]+)", (REPO / "environment.yml").read_text(), re.M)
    assert pinned and pinned[1] == torch.version.cuda, "environment.yml's cuda-version is not torch's CUDA"


@pytest.mark.skipif(build.nvcc() is None, reason="no nvcc here")
def test_the_hand_compile_command_of_notebook_03_compiles_the_exercise(tmp_path):
    import json
    import subprocess

    cells = json.loads((REPO / "notebooks" / "03_first_kernel.ipynb").read_text())["cells"]
    prose = "".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    command = re.search(r"```bash\n(.*?)```", prose, re.S)[1].replace("\\\n", " ").split()
    assert command[0] == f".venv/{toolkit.SHIM.name}/bin/nvcc"  # where `make lab` puts it
    command[0] = build.nvcc()  # the same compiler wherever this environment keeps it
    command[command.index("-o") + 1] = str(tmp_path / "01_naive.o")
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
