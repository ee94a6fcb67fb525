"""Known-wrong kernels the grader must reject, each with its own message.

tests/wrong_kernels/*.cu each plant one mistake in one correct kernel (wrong_kernel.cuh). On any
machine with nvcc every file must compile, so that what the grader rejects on a GPU is the
mistake, not a typo; on a GPU each is graded as if it were a learner's ex01 and the verdict must
say the words on its `// EXPECT:` line (alternatives split by `|`).
"""

import re
from pathlib import Path

import pytest

from mla_lab import build
from mla_lab.grade import grade_file

FOLDER = Path(__file__).parent / "wrong_kernels"
FILES = sorted(FOLDER.glob("*.cu"))


def expected_words(path: Path) -> list[str]:
    found = re.search(r"^// EXPECT: (.+)$", path.read_text(), re.M)
    assert found, f"{path.name} has no // EXPECT: line"
    return [words.strip() for words in found.group(1).split("|")]


def test_every_planted_mistake_has_its_file_and_every_file_one_mistake():
    header = (FOLDER / "wrong_kernel.cuh").read_text()
    planted = set(re.findall(r"defined\((MLA_WRONG_\w+)\)", header))
    defined = [set(re.findall(r"^#define (MLA_WRONG_\w+)", f.read_text(), re.M)) for f in FILES]
    assert all(len(names) == 1 for names in defined), "each file plants exactly one mistake"
    assert set().union(*defined) == planted, "a mistake in wrong_kernel.cuh without its file, or the reverse"
    for path in FILES:
        assert expected_words(path)


@pytest.mark.skipif(build.nvcc() is None, reason="no nvcc")
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_every_wrong_kernel_compiles(path):
    compiled, report = build.compile_report(path, ("-gencode=arch=compute_80,code=sm_80",
                                                   "-gencode=arch=compute_90,code=sm_90"))
    assert compiled, report


@pytest.mark.gpu
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_the_grader_rejects_every_wrong_kernel_with_its_own_message(path):
    result = grade_file(path, "ex01", quiet=True)
    assert result.status in ("wrong", "breaks a rule"), result.line
    assert any(words in result.line for words in expected_words(path)), result.line
