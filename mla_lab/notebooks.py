"""Re-execute the course notebooks in place, so that their stored outputs are a real run."""

from __future__ import annotations

import time
from pathlib import Path

from .steps import REPO

NOTEBOOK_DIR = REPO / "notebooks"


def execute_in_place(paths: list[Path] | None = None, timeout_s: int = 900) -> list[str]:
    """Run each notebook top to bottom in its own folder and save it with the new outputs."""
    import nbformat
    from nbclient import NotebookClient

    report = []
    for path in paths or sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        resources = {"metadata": {"path": str(path.parent)}}
        NotebookClient(notebook, timeout=timeout_s, kernel_name="python3", resources=resources).execute()
        nbformat.write(notebook, path)
        report.append(f"{path.name}: executed in {time.perf_counter() - start:.0f} s")
    return report
