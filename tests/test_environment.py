"""The course's environment: declared twice alike, JupyterLab serves it, notebooks re-run."""

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request

import pytest

from mla_lab.steps import REPO

# conda names that differ from pip's, and conda-only toolchain packages that pip cannot provide
CONDA_TO_PIP = {"pytorch-gpu": "torch"}
CONDA_ONLY = {"python", "pip", "cuda-version", "cuda-nvcc", "cuda-cudart-dev", "cuda-cuobjdump"}


def conda_packages() -> set[str]:
    text = (REPO / "environment.yml").read_text()
    names = set()
    for line in text.split("\ndependencies:\n", 1)[1].splitlines():
        match = re.match(r"^  - ([A-Za-z0-9_.-]+)", line)
        if match:
            names.add(CONDA_TO_PIP.get(match[1], match[1]))
    return names - CONDA_ONLY


def pip_packages() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~ \[]", dep)[0] for dep in project["dependencies"]}


def test_environment_yml_and_pyproject_name_the_same_packages():
    assert conda_packages() == pip_packages()
    assert {"torch", "ninja", "jupyterlab", "matplotlib", "nbval"} <= pip_packages()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_jupyterlab_serves_and_opens_the_course_notebooks(tmp_path):
    pytest.importorskip("jupyterlab", reason="JupyterLab is not installed here (pyproject installs it)")
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path), JUPYTER_CONFIG_DIR=str(tmp_path / "config"))
    log = tmp_path / "server.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
         f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={REPO}", "--allow-root"],
        stdout=subprocess.DEVNULL, stderr=log.open("w"), env=env,
    )
    base = f"http://127.0.0.1:{port}"

    def get(path: str):
        request = urllib.request.Request(base + path, headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.load(response)

    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get("/api/status")
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail("JupyterLab exited: " + log.read_text()[-2000:])
                if time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not answer on 127.0.0.1 within 60 s")
                time.sleep(0.5)
        listed = {item["name"] for item in get("/api/contents/notebooks")["content"]}
        expected = {p.name for p in (REPO / "notebooks").glob("*.ipynb")}
        assert expected and expected <= listed
        for name in sorted(expected):
            model = get(f"/api/contents/notebooks/{name}")
            assert model["type"] == "notebook" and model["content"]["cells"]
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_notebooks_pass_nbval_again_on_a_second_run():
    """pytest runs the notebooks once after the tests; this runs them once more, the same way."""
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(REPO / "notebooks")],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )
    assert result.returncode == 0, result.stdout[-3000:]
