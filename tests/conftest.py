import pytest

from mla_lab import build


def pytest_collection_modifyitems(config, items):
    """GPU tests run wherever torch sees a GPU and skip elsewhere, saying why."""
    problem = build.run_problem()
    if problem is None:
        return
    skip = pytest.mark.skip(reason=problem)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
