"""`kernels/candidates/`: changes prepared for a step, each applied and compiled here, and judged on
a GPU by the rule written in it (mla_lab.candidates)."""

import argparse
import subprocess
import sys

import pytest

import torch

from mla_lab import ab, bench, build, candidates, check, steps
from tests.test_kernel_sources import nvcc

CANDIDATES = sorted(candidates.CANDIDATES_DIR.glob("*.patch"))
STEP_12 = "kernels/12_weight_stream.cu"


@pytest.mark.parametrize("path", CANDIDATES, ids=lambda p: p.stem)
def test_every_candidate_applies_to_its_step_as_it_is_and_compiles(path):
    nvcc()  # fails in CI, skips elsewhere, where there is no nvcc
    candidate = candidates.Candidate.load(path)
    with candidates.applied(candidate) as source:
        changed = source.read_text()
        assert changed != candidate.step.source().read_text()
        with ab.older_source(str(source), candidate.built_as) as (beside, arch_flags, defines):
            ok, report = build.compile_report(beside, arch_flags, defines)
    assert ok, f"{path.name} applies but does not compile: {report}"
    assert "0 bytes of spills" in report, report
    assert (steps.REPO / candidate.target).read_text() != changed  # applied to a copy, not to the checkout


@pytest.mark.parametrize("path", CANDIDATES, ids=lambda p: p.stem)
def test_every_candidate_also_applies_on_top_of_its_steps_kept_change_and_compiles(path):
    """A step's kept change lands with the next GPU run's sweep, and the candidates are judged in that
    run against the step with it applied: a candidate fits both, or it is made again."""
    nvcc()
    candidate = candidates.Candidate.load(path)
    kept = [diff for diff in candidates.kept_changes() if candidate.target in candidates.files_changed_by(diff)]
    if not kept:
        pytest.skip(f"{candidate.target} has no kept change waiting for its sweep")
    for diff in kept:
        with candidates.applied_to_copies(candidate.path, [candidate.target], after=diff) as folder:
            source = folder / candidate.target
            with ab.older_source(str(source), candidate.built_as) as (beside, arch_flags, defines):
                ok, report = build.compile_report(beside, arch_flags, defines)
        assert ok, f"{path.name} applies on top of {diff.name} but does not compile: {report}"
        assert "0 bytes of spills" in report, report


@pytest.mark.parametrize("path", candidates.kept_changes(), ids=lambda p: p.stem)
def test_every_kept_change_applies_to_the_files_it_changes_and_compiles(path, tmp_path):
    """A change judged and kept but not yet swept (kernels/candidates/kept/) still applies to each file
    it changes as it is, its Python still parses, and each step source it changes compiles with nvcc,
    without spills."""
    nvcc()
    changed = candidates.files_changed_by(path)
    assert changed, f"{path.name} changes no file"
    with candidates.applied_to_copies(path, changed) as folder:
        for name in changed:
            text = (folder / name).read_text()
            assert text != (steps.REPO / name).read_text(), name
            if name.endswith(".py"):
                compile(text, name, "exec")
            step = next((s for s in steps.STEPS if s.source() == steps.REPO / name), None)
            if step is not None:
                with ab.older_source(str(folder / name), step) as (beside, arch_flags, defines):
                    ok, report = build.compile_report(beside, arch_flags, defines)
                assert ok, f"{path.name} applies but {name} does not compile: {report}"
                assert "0 bytes of spills" in report, report


def write_candidate(folder, name, header, body):
    path = folder / name
    path.write_text(header + "\n" + body)
    return path


def diff_of(old_line, new_line, source=STEP_12):
    """A one-line change to a step's source (step 12's unless named), as a unified diff that git applies."""
    lines = (steps.REPO / source).read_text().splitlines()
    at = lines.index(old_line)
    after = "".join(f" {line}\n" for line in lines[at + 1:at + 3])  # context: git wants some
    return f"--- a/{source}\n+++ b/{source}\n@@ -{at + 1},3 +{at + 1},3 @@\n-{old_line}\n+{new_line}\n{after}"


FIRST_LINE = (steps.REPO / STEP_12).read_text().splitlines()[0]
RULE = "Points: v2_lite@1 bf16, v2_lite@16 bf16\nKeep: 0.2 us faster at v2_lite@16 bf16\n"


def test_a_kept_change_that_no_longer_applies_says_so_in_one_line(tmp_path):
    diff = tmp_path / "12_stale.diff"
    diff.write_text("What and why.\n\n" + diff_of(FIRST_LINE, "// changed").replace(f"-{FIRST_LINE}", "-// not in step 12"))
    assert candidates.files_changed_by(diff) == [STEP_12]
    with pytest.raises(candidates.CandidateProblem, match="12_stale.diff does not apply") as said:
        with candidates.applied_to_copies(diff, [STEP_12]):
            pass
    assert "\n" not in str(said.value)


def test_a_candidate_that_does_not_fit_a_kept_change_says_so_in_one_line(tmp_path):
    kept = tmp_path / "12_kept.diff"
    kept.write_text("Kept.\n\n" + diff_of(FIRST_LINE, "// kept"))
    path = write_candidate(tmp_path, "12_try.patch", "What and why.\n\n" + RULE, diff_of(FIRST_LINE, "// tried"))
    with candidates.applied_to_copies(path, [STEP_12]) as folder:  # it fits the step as it is
        assert (folder / STEP_12).read_text().splitlines()[0] == "// tried"
    with pytest.raises(candidates.CandidateProblem, match=f"12_try.patch does not apply to {STEP_12} as it is "
                                                          "with 12_kept.diff applied") as said:
        with candidates.applied_to_copies(path, [STEP_12], after=kept):
            pass
    assert "\n" not in str(said.value)


def test_a_candidate_is_applied_to_a_copy_of_its_step(tmp_path):
    path = write_candidate(tmp_path, "12_try.patch", "What and why.\n\n" + RULE, diff_of(FIRST_LINE, "// changed"))
    candidate = candidates.Candidate.load(path)
    assert (candidate.step.number, candidate.points) == (12, ("v2_lite@1 bf16", "v2_lite@16 bf16"))
    assert (candidate.keep_point, candidate.keep_gain_us, candidate.target) == ("v2_lite@16 bf16", 0.2, STEP_12)
    with candidates.applied(candidate) as source:
        assert source.read_text().splitlines()[0] == "// changed"
    assert not source.exists()
    assert (steps.REPO / STEP_12).read_text().splitlines()[0] == FIRST_LINE


@pytest.mark.parametrize("name, header, body, said", [
    ("12_stale.patch", RULE, diff_of(FIRST_LINE, "// x").replace(FIRST_LINE, "// a line that is not there"),
     "12_stale.patch does not apply to kernels/12_weight_stream.cu as it is now"),
    ("12_norule.patch", "Points: v2_lite@16 bf16\n", diff_of(FIRST_LINE, "// x"),
     '12_norule.patch: above its diff it needs the lines "Points: POINT, POINT" and "Keep: X us faster at POINT" '
     '(or, for a probe, "Probe: what it times")'),
    ("12_both.patch", RULE + "Probe: GEMM 1 alone\n", diff_of(FIRST_LINE, "// x"),
     '12_both.patch: above its diff it needs the lines "Points: POINT, POINT" and "Keep: X us faster at POINT"'),
    ("12_far.patch", "Points: v2_lite@1 bf16\nKeep: 0.2 us faster at v2_lite@16 bf16\n", diff_of(FIRST_LINE, "// x"),
     '12_far.patch: its rule must read "Keep: X us faster at POINT" (or "... faster than step N at POINT"), '
     'POINT one of its Points'),
    ("12_rival.patch", "Points: v2_lite@1 bf16\nKeep: 0.2 us faster than step 99 at v2_lite@1 bf16\n",
     diff_of(FIRST_LINE, "// x"), "12_rival.patch: its rule names step 99, which the course does not have"),
    ("12_point.patch", "Points: v2_lite@7 bf16\nKeep: 0.2 us faster at v2_lite@7 bf16\n", diff_of(FIRST_LINE, "// x"),
     "'v2_lite@7 bf16' is not a sweep point"),
    ("11_other.patch", RULE, diff_of(FIRST_LINE, "// x"),
     "11_other.patch: it must patch solutions/11_decode.cu"),
    ("try.patch", RULE, diff_of(FIRST_LINE, "// x"), "try.patch: its name must begin with the step's number"),
])
def test_a_candidate_that_cannot_be_read_or_applied_says_so_in_one_line(tmp_path, name, header, body, said):
    path = write_candidate(tmp_path, name, header, body)
    with pytest.raises(ab.ABProblem) as problem:
        with candidates.applied(candidates.Candidate.load(path)):
            pass
    assert str(problem.value).startswith(said) and "\n" not in str(problem.value)


def timing(median, spread=0.1):
    return bench.Timing("k", "graph", median, median - spread, median + spread, 100, 0)


@pytest.mark.parametrize("at_16, at_1, kept, why", [
    (11.4, 7.7, True, "kept: +0.30 µs at v2_lite@16 bf16, 0.2 asked; slower nowhere"),
    (11.55, 7.7, False, "rejected: +0.15 µs at v2_lite@16 bf16, 0.2 asked; slower nowhere"),
    (11.75, 7.7, False, "rejected: -0.05 µs at v2_lite@16 bf16, 0.2 asked; slower nowhere"),
    (11.0, 8.2, False, "rejected: slower at v2_lite@1 bf16; +0.70 µs at v2_lite@16 bf16, 0.2 asked"),
])
def test_the_rule_keeps_a_candidate_only_at_its_gain_and_slower_nowhere(tmp_path, at_16, at_1, kept, why):
    candidate = candidates.Candidate.load(write_candidate(tmp_path, "12_try.patch", RULE, diff_of(FIRST_LINE, "// x")))
    rows = [ab.Row("v2_lite@1 bf16", timing(7.7), timing(at_1), {}), ab.Row("v2_lite@16 bf16", timing(11.7), timing(at_16), {})]
    outcome = candidates.judge(candidate, rows)
    assert (outcome.kept, outcome.why) == (kept, why)
    assert f"**{why}**" in candidates.report([outcome])
    assert "| point | step 12 µs | 12_try µs |" in candidates.report([outcome])


def test_a_candidate_may_ask_for_sm_90a_and_is_built_for_it(tmp_path):
    step_11 = steps.get(11)  # built for sm_90
    source = step_11.source().relative_to(steps.REPO).as_posix()
    first_line = step_11.source().read_text().splitlines()[0]
    rule = RULE + "Arch: sm_90a\n"
    candidate = candidates.Candidate.load(write_candidate(tmp_path, "11_wgmma.patch", rule,
                                                          diff_of(first_line, "// x", source)))
    assert candidate.built_as.arch_flags == steps.HOPPER_ARCH_FLAGS != candidate.step.arch_flags
    assert candidates.Candidate.load(write_candidate(tmp_path, "11_plain.patch", RULE,
                                                     diff_of(first_line, "// x", source))).built_as is step_11
    with pytest.raises(ab.ABProblem, match='its "Arch: sm_100" is no target a candidate may ask for'):
        candidates.Candidate.load(write_candidate(tmp_path, "12_far.patch", RULE + "Arch: sm_100\n",
                                                  diff_of(FIRST_LINE, "// x")))


def test_a_rule_that_names_a_rival_step_measures_the_gain_against_it(tmp_path):
    """Step 12 taken to 64 tokens: there the step as it stands runs its fallback, so the gain that
    keeps it is over step 6, timed beside it; slower still means slower than step 12 as it stands."""
    rule = "Points: v2_lite@1 bf16, v2_lite@64 bf16\nKeep: 2 us faster than step 6 at v2_lite@64 bf16\n"
    candidate = candidates.Candidate.load(write_candidate(tmp_path, "12_wider.patch", rule, diff_of(FIRST_LINE, "// x")))
    assert (candidate.rival.number, candidate.against) == (6, "step 6")

    def rows(at_64, at_1):
        return [ab.Row("v2_lite@1 bf16", timing(7.7), timing(at_1), {"step 6": timing(15.1)}),
                ab.Row("v2_lite@64 bf16", timing(370.0), timing(at_64), {"step 6": timing(16.1)})]

    assert candidates.judge(candidate, rows(13.0, 7.7)).why == \
        "kept: +3.10 µs than step 6 at v2_lite@64 bf16, 2 asked; slower nowhere"
    assert candidates.judge(candidate, rows(15.0, 7.7)).why == \
        "rejected: +1.10 µs than step 6 at v2_lite@64 bf16, 2 asked; slower nowhere"
    assert candidates.judge(candidate, rows(13.0, 8.2)).why.startswith("rejected: slower at v2_lite@1 bf16; ")
    report = candidates.report([candidates.judge(candidate, rows(13.0, 7.7))])
    assert "| point | step 12 µs | 12_wider µs | step 6 µs | cuBLAS concat µs |" in report
    assert "| v2_lite@64 bf16 | 370.0 (369.9-370.1) | 13.0 (12.9-13.1) | 16.1 (16.0-16.2) | - | - | 0.035 | faster |" \
        in report


def test_a_candidate_wrong_on_the_shape_matrix_is_rejected_before_it_is_timed(tmp_path, monkeypatch):
    """Without a GPU: the build, the kernels and the checks stood in for; one odd shape fails."""
    write_candidate(tmp_path, "12_wrong.patch", RULE, diff_of(FIRST_LINE, "// wrong somewhere"))
    monkeypatch.setattr(candidates, "CANDIDATES_DIR", tmp_path)
    monkeypatch.setattr(build, "require_gpu", lambda: None)
    monkeypatch.setattr(build, "build_step", lambda *args, **kwargs: None)
    monkeypatch.setattr(steps, "Kernel", lambda step, source, library: type("Form", (), {"prepares_weights": False})())
    odd = check.SHAPE_MATRIX[3]
    checked = []

    def check_matrix(call, device, trials):
        checked.append(device)
        return [check.Verdict(odd, torch.bfloat16, 1.0, 1.0, "NaN left in 3 outputs"),
                check.Verdict(odd, torch.float32, 0.0, 0.0)]

    def compare(*args, **kwargs):
        raise AssertionError("timed although wrong")

    monkeypatch.setattr(check, "check_matrix", check_matrix)
    monkeypatch.setattr(ab, "compare", compare)
    [outcome] = candidates.each_judged(candidates.all_candidates())
    assert checked == ["cuda"] and not outcome.kept and outcome.rows == []
    assert outcome.why == (f"rejected: 1 checks of the shape matrix failed, the first 12_wrong: WRONG {odd.label()} "
                           "bfloat16: NaN left in 3 outputs")


def test_a_probe_is_timed_unchecked_and_never_judged(tmp_path, monkeypatch):
    """Without a GPU: the build and the kernels stood in for; a probe's outputs are wrong on purpose,
    so it is neither checked nor judged, only timed beside its step."""
    write_candidate(tmp_path, "12_cut.patch", "Points: v2_lite@1 bf16\nProbe: GEMM 1 alone\n",
                    diff_of(FIRST_LINE, "// cut short"))
    monkeypatch.setattr(candidates, "CANDIDATES_DIR", tmp_path)
    monkeypatch.setattr(build, "require_gpu", lambda: None)
    monkeypatch.setattr(build, "build_step", lambda *args, **kwargs: None)
    monkeypatch.setattr(steps, "Kernel", lambda step, source, library: type("Form", (), {"prepares_weights": False})())
    monkeypatch.setattr(steps, "load", lambda step: "the step")

    def never(*args, **kwargs):
        raise AssertionError("a probe was checked or judged")

    timed = []

    def compare(before, after, parsed, checked=True):
        timed.append((before, [name for name, _, _ in parsed], checked))
        return [ab.Row("v2_lite@1 bf16", timing(15.0), timing(6.0), {})]

    monkeypatch.setattr(check, "check_matrix", never)
    monkeypatch.setattr(candidates, "judge", never)
    monkeypatch.setattr(ab, "compare", compare)
    [outcome] = candidates.each_judged(candidates.all_candidates())
    assert timed == [("the step", ["v2_lite@1 bf16"], False)]
    assert not outcome.kept and outcome.why == "probe, timed unchecked: GEMM 1 alone"
    assert "| v2_lite@1 bf16 | 15.0 (14.9-15.1) | 6.0 (5.9-6.1) | - | - | 0.400 |\n" in candidates.report([outcome]) + "\n"


@pytest.mark.parametrize("listing", [False, True])
def test_with_no_candidate_there_is_one_line_and_no_gpu_asked(tmp_path, monkeypatch, capsys, listing):
    from mla_lab import __main__ as cli

    def no_gpu():
        raise AssertionError("a GPU was asked for with nothing to judge")

    monkeypatch.setattr(candidates, "CANDIDATES_DIR", tmp_path / "candidates")
    monkeypatch.setattr(build, "require_gpu", no_gpu)
    assert cli.candidates(argparse.Namespace(names=[], list=listing, round=False, replay=False)) == 0
    assert capsys.readouterr().out == "kernels/candidates/ holds no candidate: nothing to apply or judge\n"


def test_each_outcome_is_printed_as_it_is_known_so_a_later_hang_loses_nothing(tmp_path, monkeypatch, capsys):
    """Without a GPU: the GPU and the judging stood in for. The second candidate fails to finish
    (as one that hangs until the machine is taken back would); the first's table is out already."""
    from mla_lab import __main__ as cli

    for name in ("12_first.patch", "12_second.patch"):
        write_candidate(tmp_path, name, RULE, diff_of(FIRST_LINE, "// x"))
    monkeypatch.setattr(candidates, "CANDIDATES_DIR", tmp_path)
    monkeypatch.setattr(build, "require_gpu", lambda: None)
    monkeypatch.setattr(bench, "device_line", lambda: "a GPU")
    first, second = candidates.all_candidates()

    def each_judged(chosen):
        assert chosen == [first, second]
        yield candidates.judge(first, [ab.Row("v2_lite@1 bf16", timing(7.7), timing(7.6), {}),
                                       ab.Row("v2_lite@16 bf16", timing(11.7), timing(11.0), {})])
        raise TimeoutError("the machine was taken back")

    monkeypatch.setattr(candidates, "each_judged", each_judged)
    with pytest.raises(TimeoutError):
        cli.candidates(argparse.Namespace(names=[], list=False, round=False, replay=False))
    out = capsys.readouterr().out
    assert out.startswith("a GPU; graph replay") and "## 12_first.patch" in out and "**kept: +0.70 µs" in out
    assert "12_second" not in out


def test_the_list_reads_and_applies_every_candidate_without_a_gpu():
    result = subprocess.run([sys.executable, "-m", "mla_lab", "candidates", "--list"], cwd=steps.REPO,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(", applies; at ") == len(CANDIDATES)


def test_an_unknown_candidate_is_one_line_naming_those_there_are():
    result = subprocess.run([sys.executable, "-m", "mla_lab", "candidates", "12_nothing"], cwd=steps.REPO,
                            capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.startswith("mla_lab: no candidate 12_nothing; kernels/candidates/ holds")
    assert result.stderr.count("\n") == 1


@pytest.mark.gpu
def test_a_candidate_is_checked_timed_beside_its_step_and_judged(tmp_path, monkeypatch):
    """A comment-only candidate: the same machine code, so the rule's 5 µs is never met."""
    write_candidate(tmp_path, "12_same.patch", "Points: v2_lite@1 bf16\nKeep: 5 us faster at v2_lite@1 bf16\n",
                    diff_of(FIRST_LINE, "// the same kernel"))
    monkeypatch.setattr(candidates, "CANDIDATES_DIR", tmp_path)
    [outcome] = candidates.each_judged(candidates.all_candidates())
    assert [r.point for r in outcome.rows] == ["v2_lite@1 bf16"] and not outcome.kept
    assert {"eager", "cuBLAS concat"} <= set(outcome.rows[0].peers)
    assert outcome.why.startswith("rejected: ")


@pytest.mark.gpu
def test_a_probe_is_timed_beside_its_step_unchecked(tmp_path):
    """A comment-only probe times as its step does; the row has its step, the probe and the peers."""
    probe = candidates.Candidate.load(write_candidate(tmp_path, "12_same.patch", "Points: v2_lite@1 bf16\n"
                                                      "Probe: the same kernel\n", diff_of(FIRST_LINE, "// the same kernel")))
    with candidates.applied(probe) as source, ab.built(probe.step, str(source)) as after:
        [row] = ab.compare(steps.load(probe.step), after, list(probe.point_shapes), checked=False)
    assert row.point == "v2_lite@1 bf16" and {"eager", "cuBLAS concat"} == set(row.peers)
    assert 0.5 < row.after.median_us / row.before.median_us < 2


def a_checkout(root, changes):
    """A checkout at ROOT holding step 12's source and kernels/candidates/ with CHANGES ({name: diff})."""
    (root / "kernels" / "candidates" / "kept").mkdir(parents=True)
    (root / STEP_12).write_text((steps.REPO / STEP_12).read_text())
    for name, body in changes.items():
        folder = root / "kernels" / "candidates" / ("kept" if name.endswith(".diff") else "")
        (folder / name).write_text(body)
    return root


SECOND_LINE = (steps.REPO / STEP_12).read_text().splitlines()[2]  # far enough from the first for git's context


def test_a_round_lands_the_kept_diffs_and_the_kept_candidates_and_a_later_sitting_replays_them(tmp_path, monkeypatch):
    changes = {"12_kept.diff": "Kept.\n\n" + diff_of(FIRST_LINE, "// kept"),
               "12_good.patch": "Good.\n\n" + RULE + "\n" + diff_of(SECOND_LINE, "// good"),
               "12_bad.patch": "Bad.\n\n" + RULE + "\n" + diff_of(SECOND_LINE, "// bad"),
               "12_rival.patch": "Kept too, but it changes the good one's line.\n\n" + RULE + "\n"
                                 + diff_of(SECOND_LINE, "// rival")}
    played = a_checkout(tmp_path / "played", changes)
    monkeypatch.setattr(candidates, "CANDIDATES_DIR", played / "kernels" / "candidates")
    kept = {"12_good", "12_rival"}
    monkeypatch.setattr(candidates, "each_judged", lambda chosen: (
        candidates.Outcome(c, [], c.name in kept, "kept" if c.name in kept else "rejected") for c in chosen))
    folder = tmp_path / "round"
    said = "\n".join(candidates.play_round(folder, played))
    lines = (played / STEP_12).read_text().splitlines()
    assert lines[0] == "// kept" and lines[2] == "// good"  # the kept diff, then the candidate kept by its rule
    assert "not applied: 12_rival.patch does not apply" in said  # kept alone; judged again next round
    assert [origin for _, origin in candidates.round_landed(folder)] == [
        "kernels/candidates/kept/12_kept.diff", "kernels/candidates/12_good.patch"]
    assert "the round landed: kernels/candidates/kept/12_kept.diff, kernels/candidates/12_good.patch" in said
    assert "**rejected**" in (folder / "verdicts.md").read_text()

    (played / STEP_12).write_text((steps.REPO / STEP_12).read_text())  # a later sitting's fresh tree
    monkeypatch.setattr(candidates, "each_judged", lambda chosen: pytest.fail("a whole round is not judged again"))
    assert "replayed the round's 2 changes" in "\n".join(candidates.play_round(folder, played))
    assert (played / STEP_12).read_text().splitlines()[:3:2] == ["// kept", "// good"]

    committing = a_checkout(tmp_path / "committing", changes)
    assert candidates.replay(folder, committing, delete_origins=True) == [
        "kernels/candidates/kept/12_kept.diff", "kernels/candidates/12_good.patch"]
    assert (committing / STEP_12).read_text() == (played / STEP_12).read_text()
    left = sorted(p.name for p in (committing / "kernels" / "candidates").rglob("*.*"))
    assert left == ["12_bad.patch", "12_rival.patch"]  # until their lines go into the notes, or a round lands them


def test_a_round_whose_judging_did_not_end_is_not_replayed(tmp_path):
    folder = tmp_path / "round"
    folder.mkdir()
    (folder / candidates.LANDED).write_text("01_12_kept.diff\tkernels/candidates/kept/12_kept.diff\n")
    with pytest.raises(candidates.CandidateProblem, match="holds no whole round") as said:
        candidates.replay(folder, tmp_path)
    assert "\n" not in str(said.value)
