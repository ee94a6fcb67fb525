"""The experiments' scripts (experiments/ is not a package), loaded by path for the tests that check them."""

import importlib.util
from types import ModuleType

from mla_lab.steps import REPO


def load(relative: str) -> ModuleType:
    """experiments/<relative> as a module, for example load("tf32/lab.py")."""
    path = REPO / "experiments" / relative
    spec = importlib.util.spec_from_file_location(f"{path.parent.name}_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
