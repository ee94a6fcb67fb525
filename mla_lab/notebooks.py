"""Re-execute the course notebooks in place, so that their stored outputs are a real run.

Each run stamps what it ran: every code cell gets the digest of the source that made its outputs,
and the notebook the fingerprint of the kernels and support code it ran on. A test holds the
committed notebooks to both, so an output cannot outlive the code that printed it.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from .steps import REPO

NOTEBOOK_DIR = REPO / "notebooks"
STAMP = "mla_lab"


def cell_digest(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def execute_in_place(paths: list[Path] | None = None, timeout_s: int = 900) -> list[str]:
    """Run each notebook top to bottom in its own folder and save it with the new outputs."""
    import nbformat
    from nbclient import NotebookClient

    from .sweep import sources_fingerprint

    report = []
    for path in paths or sorted(NOTEBOOK_DIR.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        start = time.perf_counter()
        resources = {"metadata": {"path": str(path.parent)}}
        NotebookClient(notebook, timeout=timeout_s, kernel_name="python3", resources=resources).execute()
        for cell in notebook.cells:
            if cell.cell_type == "code":
                cell.metadata[STAMP] = {"executed_source": cell_digest(cell.source)}
        notebook.metadata[STAMP] = {"sources": sources_fingerprint()}
        nbformat.write(notebook, path)
        report.append(f"{path.name}: executed in {time.perf_counter() - start:.0f} s")
    return report
