"""`python -m mla_lab ab`: a step as another commit had it, beside this checkout's (mla_lab.ab)."""

import subprocess
import sys

import pytest

from mla_lab import ab, bench, build, steps


def git_show(spec: str) -> str:
    return subprocess.run(["git", "show", spec], cwd=steps.REPO, capture_output=True, text=True, check=True).stdout


def test_the_old_source_is_written_beside_the_old_headers():
    """REV's .cu next to REV's course headers, so that its quoted includes find those, not this
    checkout's (which `build` adds with -I), and REV's own build flags."""
    step = steps.get(6)
    with ab.source_at("HEAD", step) as (source, arch_flags, defines):
        assert source.parent.name == "kernels" and source.read_text() == git_show("HEAD:solutions/06_hopper.cu")
        for header in ("mla_common.cuh", "mla_hopper.cuh", "mla_launch.h"):
            assert (source.parent / header).read_text() == git_show(f"HEAD:kernels/{header}")
        assert (arch_flags, defines) == (step.arch_flags, step.defines)
    assert not source.exists()  # the checkout of REV is gone afterwards


def test_the_old_source_compiles_against_its_own_headers():
    step = steps.get(6)
    with ab.source_at("HEAD", step) as (source, arch_flags, defines):
        (source.parent / "mla_hopper.cuh").write_text('#error "the copied header was included"\n')
        ok, report = build.compile_report(source, arch_flags, defines)
    assert not ok and "the copied header was included" in report


def test_an_older_source_given_as_a_file_is_built_beside_this_checkouts_headers(tmp_path):
    """For a checkout without history (a GPU machine lent a copy of the working tree): the file,
    under the step's own name, next to copies of this checkout's course headers, with this
    checkout's build flags; the copies are gone afterwards."""
    step = steps.get(10)
    older = tmp_path / "old.cu"
    older.write_text(git_show("HEAD:kernels/09_tf32_wgmma.cu") + "// an older form\n")
    with ab.older_source(str(older), step) as (source, arch_flags, defines):
        assert source.name == "09_tf32_wgmma.cu" and source.read_text() == older.read_text()
        for header in ("mla_common.cuh", "mla_hopper.cuh", "mla_launch.h"):
            assert (source.parent / header).read_text() == (steps.KERNELS_DIR / header).read_text()
        assert (arch_flags, defines) == (step.arch_flags, step.defines) and defines == ("MLA_THREE_PASSES=1",)
        (source.parent / "mla_hopper.cuh").write_text('#error "the copied header was included"\n')
        ok, report = build.compile_report(source, arch_flags, defines)
        assert not ok and "the copied header was included" in report
    assert not source.parent.exists()
    assert ab.label_of(str(older)) != ab.label_of("HEAD")


def test_a_timing_is_faster_or_slower_only_outside_the_other_ones_spread():
    def timing(median, low, high):
        return bench.Timing("k", "graph", median, low, high, 100, 0)

    before = timing(10.0, 9.8, 10.2)
    assert ab.Row("p", before, timing(9.0, 8.9, 9.1), {}).verdict == "faster"
    assert ab.Row("p", before, timing(11.0, 10.9, 11.1), {}).verdict == "slower"
    assert ab.Row("p", before, timing(9.9, 9.7, 10.1), {}).verdict == "inside the spread"
    row = ab.Row("v2_lite@1 bf16", before, timing(9.0, 8.9, 9.1), {"cuBLAS concat": timing(8.0, 7.9, 8.1)})
    line = ab.table([row], "abc1234").splitlines()[-1]
    assert line.startswith("| v2_lite@1 bf16 | 10.0 (9.8-10.2) | 9.0 (8.9-9.1) | 8.0 | - | 0.900 | faster |")


@pytest.mark.parametrize("arguments, said", [
    (["6", "--against", "no-such-commit"], "'no-such-commit' is not a commit of this repository (git log --oneline "
                                           "lists them); where the checkout has no history, give the older source as a file"),
    (["6", "--against", "HEAD", "--points", "v2_lite@7 bf16"], "'v2_lite@7 bf16' is not a sweep point"),
    (["99", "--against", "HEAD"], "no step 99"),
])
def test_a_wrong_argument_is_one_line_before_any_gpu_is_needed(arguments, said):
    result = subprocess.run([sys.executable, "-m", "mla_lab", "ab", *arguments], cwd=steps.REPO,
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith(f"mla_lab: {said}") and result.stderr.count("\n") == 1


@pytest.mark.gpu
def test_a_step_against_itself_is_checked_then_timed_beside_the_peers():
    rows = ab.run(6, "HEAD", ["toy bf16", "v2_lite@1 bf16"])
    assert [r.point for r in rows] == ["toy bf16", "v2_lite@1 bf16"]
    for r in rows:
        assert {"eager", "cuBLAS concat"} <= set(r.peers)
        assert 0.5 < r.after.median_us / r.before.median_us < 2.0


@pytest.mark.gpu
def test_a_step_that_prepares_its_weights_is_also_timed_given_them():
    rows = ab.run(10, "HEAD", ["v2_lite@1 fp32"])
    assert [r.point for r in rows] == ["v2_lite@1 fp32", "v2_lite@1 fp32 prepared"]
    assert rows[0].peers is rows[1].peers and "cuBLAS concat" in rows[0].peers
    assert rows[1].after.median_us < rows[0].after.median_us  # the transposes left the call


def test_prepared_rows_follow_their_pair_where_both_forms_prepare_weights(monkeypatch):
    """Without a GPU: the kernels and the timing stood in for, what `run` asks of them and the rows
    it makes. fp32 points of a step whose both forms prepare get a second row, timed in the same
    round with the same peers; bf16 points, and forms that do not prepare, do not."""

    class Form:
        def __init__(self, prepares: bool) -> None:
            self.prepares_weights, self.step = prepares, steps.get(10)

        def prepare(self, *weights):
            raise AssertionError("bench.measure prepares, not run")

    forms = {"before": Form(True), "after": Form(True)}
    asked = []

    def measure(contenders, shape, dtype, peers, modes, seed, rotate_inputs, checked):
        assert rotate_inputs, "an A/B times as the sweep does, its inputs rotated past the L2"
        assert checked, "an A/B checks both forms before timing them"
        asked.append(sorted(contenders))
        return [bench.Result(name, shape.label(), shape.tokens, "fp32", modes[0], "ok", median_us=10.0 + i,
                             p10_us=9.9 + i, p90_us=10.1 + i, samples=100)
                for i, name in enumerate([*contenders, *peers])]

    monkeypatch.setattr(build, "require_gpu", lambda: None)
    monkeypatch.setattr(build, "build_step", lambda *args, **kwargs: None)
    monkeypatch.setattr(steps, "Kernel", lambda step, source, library: forms["before"])
    monkeypatch.setattr(steps, "load", lambda step: forms["after"])
    monkeypatch.setattr(bench, "measure", measure)

    rows = ab.run(10, "HEAD", ["v2_lite@1 fp32", "v2_lite@1 bf16"])
    assert [r.point for r in rows] == ["v2_lite@1 fp32", "v2_lite@1 fp32 prepared", "v2_lite@1 bf16"]
    assert asked[0] == ["after", "after prepared", "before", "before prepared"] and asked[1] == ["after", "before"]
    assert (rows[1].before.median_us, rows[1].after.median_us) == (12.0, 13.0)
    assert rows[0].peers is rows[1].peers and set(rows[0].peers) == {"eager", "cuBLAS concat"}

    forms["before"] = Form(False)  # an older form from before `prepare`
    assert [r.point for r in ab.run(10, "HEAD", ["v2_lite@1 fp32"])] == ["v2_lite@1 fp32"]
