"""References between the course's documents resolve: a file a notebook, the README or a source
names exists, and a section of kernels/NOTES.md named by its title is there."""

import json
import re

import pytest

from mla_lab.steps import REPO

NOTES = REPO / "kernels" / "NOTES.md"
FOLDERS = ("kernels", "experiments", "solutions", "exercises", "mla_lab", "notebooks", "results", "tests")
# A repository path such as `experiments/step6/lab.py`: a course folder, then a file with an extension.
PATH = re.compile(r"(?<![\w/.])((?:%s)/[\w./-]*?\.(?:cuh|cu|h|cpp|py|md|json|png|ipynb))(?![\w])" % "|".join(FOLDERS))
# A NOTES.md section named by its title: kernels/NOTES.md, "Step 8 experiment 2" (or in parentheses).
SECTION = re.compile(r"NOTES\.md`?,?\s*\(?\"([^\"]+)\"")


def texts() -> dict[str, str]:
    """Every document a learner reads, and every source, as text (a notebook's cells joined; a
    comment running over lines joined into one). kernels/NOTES.md itself is a log, which may name
    files of other commits and branches, and tests name files they make up."""
    found = {}
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        found[path.name] = "\n".join("".join(cell["source"]) for cell in cells)
    found["README.md"] = (REPO / "README.md").read_text()
    for folder, pattern in [("kernels", "*.cu*"), ("solutions", "*.cu"), ("exercises", "*.cu"), ("mla_lab", "*.py"),
                            ("experiments", "*/*.py"), ("experiments", "*/*.cu"), ("experiments", "*.py")]:
        for path in sorted((REPO / folder).glob(pattern)):
            found[str(path.relative_to(REPO))] = re.sub(r"\n\s*(//|#)", "\n", path.read_text())
    return found


TEXTS = texts()


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_every_file_a_document_names_exists(name):
    missing = sorted({path for path in PATH.findall(TEXTS[name]) if not (REPO / path).exists()})
    assert not missing, f"{name} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_every_notes_section_a_document_names_is_there(name):
    titles = [line.lstrip("#").strip() for line in NOTES.read_text().splitlines() if line.startswith(("## ", "### "))]
    named = {" ".join(title.split()) for title in SECTION.findall(TEXTS[name].replace('\\"', '"'))}
    missing = sorted(title for title in named if not any(heading.startswith(title) for heading in titles))
    assert not missing, f"{name} names sections kernels/NOTES.md does not have: {missing}"


def test_the_notes_list_their_sections_and_what_waits_for_a_gpu():
    """kernels/NOTES.md opens with its sections, as its headings are, and with what is built and
    not yet run, naming sections that are there."""
    text = NOTES.read_text()
    listed = text.split("Sections (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [line.removeprefix("- ") for line in listed] == [line[3:] for line in text.splitlines()
                                                           if line.startswith("## ")]
    waiting = text.split("Built and not yet run on a GPU", 1)[1].split("\n\n", 1)[0]
    titles = [line.lstrip("#").strip() for line in text.splitlines() if line.startswith(("## ", "### "))]
    named = [" ".join(title.split()) for title in re.findall(r'"([^"]+)"', waiting)]
    assert named or waiting.startswith(": nothing"), "say what waits for a GPU, by section title, or ': nothing'"
    assert all(any(heading.startswith(title) for heading in titles) for title in named), named


def test_the_checks_can_fail():
    """Both patterns find what they are for, so a test above that passes has looked."""
    assert PATH.findall("see `kernels/mla_common.cuh` and experiments/step6/lab.py.") == [
        "kernels/mla_common.cuh", "experiments/step6/lab.py"]
    assert SECTION.findall('kernels/NOTES.md, "Step 8\nexperiment 2")') == ["Step 8\nexperiment 2"]
