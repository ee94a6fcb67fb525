"""The course's documents hold together: every file a document names exists, and the project
speaks of itself only (no work-log words: numbered work sessions, branch names)."""

import json
import re
import subprocess

import pytest

from mla_lab.steps import REPO

FOLDERS = ("kernels", "solutions", "exercises", "mla_lab", "notebooks", "results", "tests", ".ci")
# A repository path such as `kernels/06_hopper.md`: a course folder, then a file with an extension.
PATH = re.compile(r"(?<![\w/.])((?:%s)/[\w./-]*?\.(?:cuh|cu|h|cpp|py|md|json|png|ipynb))(?![\w])" % "|".join(FOLDERS))
# Words of a work log rather than of a course: a numbered work session or call, a wip/ branch, "the issue".
WORK_LOG = re.compile(r"\b(?:stop|call)s? \d+\b|\bwip/\w|\bthe issue\b", re.I)


def tracked_texts() -> dict[str, str]:
    """Every tracked text file but the measured data, a notebook as its cells' sources joined and
    a comment running over lines joined into one."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    found = {}
    for name in listed:
        path = REPO / name
        if path.suffix in (".png", ".json") or not path.exists():
            continue
        if path.suffix == ".ipynb":
            found[name] = "\n".join("".join(cell["source"]) for cell in json.loads(path.read_text())["cells"])
        else:
            found[name] = re.sub(r"\n\s*(//|#)", "\n", path.read_text())
    return found


TEXTS = tracked_texts()


@pytest.mark.parametrize("name", sorted(name for name in TEXTS if not name.startswith("tests/")))  # tests make files up
def test_every_file_a_document_names_exists(name):
    named = {path for path in PATH.findall(TEXTS[name]) if "NN_name" not in path}  # the naming pattern itself
    missing = sorted(path for path in named if not (REPO / path).exists())
    assert not missing, f"{name} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_the_project_speaks_of_itself_only(name):
    if name == "tests/test_docs.py":
        return  # it spells the pattern out
    found = sorted({m.group(0) for m in WORK_LOG.finditer(TEXTS[name])})
    assert not found, f"{name} speaks of its own work log ({found}): say what the code does; history lives in git"


def test_the_checks_can_fail():
    """Both patterns find what they are for, so a test above that passes has looked."""
    assert PATH.findall("see `kernels/mla_common.cuh` and kernels/99_gone.md.") == [
        "kernels/mla_common.cuh", "kernels/99_gone.md"]
    log = "measured in {} 29, {} 2, on {}/next; the issue".format("Stop", "call", "wip")  # not spelled out here
    assert [m.group(0) for m in WORK_LOG.finditer(log)] == [log[12:19], log[21:27], log[32:37], "the issue"]


def test_the_setup_notebook_and_the_readme_list_every_notebook():
    setup = json.loads((REPO / "notebooks" / "00_setup.ipynb").read_text())
    prose = "".join("".join(cell["source"]) for cell in setup["cells"] if cell["cell_type"] == "markdown")
    readme = (REPO / "README.md").read_text()
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        if path.stem != "00_setup":
            assert f"| {path.stem} |" in prose, f"notebook 00's course table does not list {path.stem}"
        assert f"| `{path.stem}` |" in readme, f"the README's course table does not list {path.stem}"


@pytest.mark.parametrize("path", [REPO / "README.md", *sorted((REPO / "kernels").glob("*.md"))],
                         ids=lambda p: p.name)
def test_the_front_door_and_each_notes_page_stay_within_a_hundred_lines(path):
    """A reader takes in a page of this length at once; what does not fit belongs in git's history
    (a notes page names the commit) or in the notebook that teaches it."""
    lines = path.read_text().count("\n")
    assert lines <= 100, f"{path.relative_to(REPO)} has {lines} lines: say it shorter, or move detail out"
