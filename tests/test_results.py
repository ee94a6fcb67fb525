"""The committed benchmark results: complete, self-describing, and the README's table made from them."""

import json
import re

import matplotlib.pyplot as plt
import pytest
import torch

from mla_lab import bench, dispatch, fingerprint, notebooks, plots, steps, sweep

SWEEPS = sweep.committed_sweeps()
NOTEBOOKS = sorted(notebooks.NOTEBOOK_DIR.glob("*.ipynb"))
META_FIELDS = {"device", "compute_capability", "driver", "torch", "cuda", "date", "command", "git_commit", "sources",
               "ceilings"}  # and, since results record it, "fingerprint" (checked on the newest)


def test_results_are_committed():
    assert SWEEPS, "results/ holds no sweep: run `make bench` on a GPU machine and commit results/"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_sweep_says_where_and_how_it_was_measured(path):
    record = sweep.Sweep.load(path)
    assert META_FIELDS <= set(record.meta), META_FIELDS - set(record.meta)
    assert set(record.meta["ceilings"]) == {"bf16 matmul TFLOP/s", "fp32 matmul TFLOP/s", "tf32 matmul TFLOP/s", "copy TB/s"}
    assert path == sweep.sweep_path_for(record.meta)


NEWEST = sweep.newest() if SWEEPS else None


def test_the_newest_sweep_records_what_its_numbers_depend_on():
    recorded = NEWEST.meta.get("fingerprint")
    if recorded is None:  # a sweep from before results recorded it: the table calls every number stale
        assert "every number waits" in sweep.results_table(NEWEST, with_staleness=True)
        return
    assert set(recorded) in ({"measuring", "steps"}, {"measuring", "dispatcher", "steps"})  # before, and since,
    # the dispatcher's rules had a digest of their own
    assert set(recorded["steps"]) == {str(s.number) for s in steps.STEPS}
    assert NEWEST.meta["sources"] == fingerprint.short(recorded)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_notebook_outputs_come_from_these_cells_in_the_run_that_made_the_results(path):
    rerun = "run `make gpu-check` on a GPU machine and commit notebooks/ and results/"
    notebook = json.loads(path.read_text())
    ran_on = notebook["metadata"].get(notebooks.STAMP, {}).get("sources")
    assert ran_on == NEWEST.meta["sources"], (
        f"{path.name} was executed on sources {ran_on}, the results on {NEWEST.meta['sources']}: {rerun}")
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code" or not cell["outputs"]:
            continue
        executed = cell["metadata"].get(notebooks.STAMP, {}).get("executed_source")
        assert executed == notebooks.cell_digest("".join(cell["source"])), (
            f"{path.name}, cell {index}: its code changed after its outputs were stored: {rerun}")
        for output in cell["outputs"]:
            text = "".join(output.get("text", ""))
            assert output.get("output_type") != "error" and "Warning" not in text, (
                f"{path.name}, cell {index} stored an error or a warning: {text[:200]}")


def test_the_newest_sweep_covers_every_step_peer_shape_dtype_and_mode():
    record = NEWEST
    names = {s.label for s in steps.STEPS} | set(sweep.PEERS) | {dispatch.NAME}
    seen = {(r.name, r.shape, r.dtype, r.mode) for r in record.results}
    for name in names:
        for shape in sweep.SHAPES:
            for dtype in sweep.DTYPES:
                if name == "cuBLAS concat TF32" and dtype == "bf16":
                    continue
                for mode in ("graph", "stream"):
                    assert (name, shape, dtype, mode) in seen, (name, shape, dtype, mode)


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_no_contender_of_a_sweep_was_wrong_or_failed(path):
    record = sweep.Sweep.load(path)
    assert not [r for r in record.results if r.status == "wrong"], "a contender was wrong when measured"
    # A contender that cannot run at a point is skipped there, with the reason; one that failed
    # means the sweep (or the contender) is broken, and its numbers are not the course's.
    assert not [r for r in record.results if r.status == "failed"], "a contender failed in the sweep"
    for r in record.results:
        if r.status == "ok":
            assert r.median_us > 0 and r.samples >= 10 and r.p10_us <= r.median_us <= r.p90_us, r
        else:
            assert r.status == "skipped" and r.note, r


def test_the_readme_table_is_the_one_the_newest_results_give():
    readme = sweep.README.read_text()
    assert sweep.readme_with_table(readme, sweep.results_table(NEWEST, with_staleness=True)) == readme, (
        "README.md's results table differs from results/*.json: run `python -m mla_lab results`"
    )


def test_the_table_names_the_steps_a_change_made_stale():
    here = fingerprint.current()
    record = sweep.Sweep({**NEWEST.meta, "fingerprint": here}, NEWEST.results)
    assert "Stale" not in sweep.results_table(record, with_staleness=True)
    changed = {**here, "steps": {**here["steps"], "6": "0" * 12, "9": "1" * 12}}
    stale = sweep.Sweep({**NEWEST.meta, "fingerprint": changed}, [])
    assert "**Stale.** Steps 6, 9 changed since this sweep: their rows wait" in sweep.results_table(
        stale, with_staleness=True)
    assert "Stale" not in sweep.results_table(stale)  # what the notebooks print
    rules = sweep.Sweep({**NEWEST.meta, "fingerprint": {**here, "dispatcher": "3" * 12}}, [])
    assert "**Stale.** mla_lab.project's rules changed since this sweep: its rows wait" in sweep.results_table(
        rules, with_staleness=True)
    both = sweep.Sweep({**NEWEST.meta, "fingerprint": {**changed, "dispatcher": "3" * 12}}, [])
    assert "**Stale.** Steps 6, 9 and mla_lab.project's rules changed" in sweep.results_table(both, with_staleness=True)
    harness = {**here, "measuring": "2" * 12}
    assert "every number waits" in sweep.results_table(sweep.Sweep({**NEWEST.meta, "fingerprint": harness}, []),
                                                        with_staleness=True)


def test_the_fingerprint_follows_the_code_not_its_comments_or_layout():
    code = "int f(int x) {\n  return x + 1;  // one more\n}\n"
    assert fingerprint.c_code(code) == fingerprint.c_code("/* doc */ int f(int x)\n{ return x + 1; }")
    assert fingerprint.c_code(code) != fingerprint.c_code(code.replace("+ 1", "+ 2"))
    assert '"// not a comment"' in fingerprint.c_code('s = "// not a comment";')
    python = 'def f(x):\n    """Doc."""\n    return x + 1  # one more\n'
    assert fingerprint.python_code(python) == fingerprint.python_code("def f(x):\n    return x + 1\n")
    assert fingerprint.python_code(python) != fingerprint.python_code(python.replace("+ 1", "+ 2"))


def test_the_python_fingerprint_is_the_same_on_every_python_version():
    # A sweep is measured on the GPU machine's Python and checked by CI's: ast.dump differs between
    # them (3.12 added empty type_params, 3.13 leaves empty fields out, 3.12 gives a nested format
    # spec an extra empty piece), this text must not.
    assert fingerprint.python_code('f"{x:{w}}"\n') == (
        "Module(body=[Expr(value=JoinedStr(values=[FormattedValue(value=Name(id='x',ctx=Load()),conversion=-1,"
        "format_spec=JoinedStr(values=[FormattedValue(value=Name(id='w',ctx=Load()),conversion=-1)]))]))])"
    )
    assert fingerprint.python_code("def f(x=1):\n    return x + 1\n") == (
        "Module(body=[FunctionDef(name='f',args=arguments(args=[arg(arg='x')],defaults=[Constant(value=1)]),"
        "body=[Return(value=BinOp(left=Name(id='x',ctx=Load()),op=Add(),right=Constant(value=1)))])])"
    )


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_the_plots_are_drawn_from_the_json_and_committed(path):
    figures = plots.sweep_figures(sweep.Sweep.load(path))
    kinds = ("speed_vs_tokens", "roofline", "accuracy_vs_speed")
    assert set(figures) == {f"{kind}_{dtype}" for kind in kinds for dtype in ("bf16", "fp32")}
    plt.close("all")
    for name in figures:
        assert path.with_name(f"{path.stem}_{name}.png").exists(), f"run `python -m mla_lab results` and commit {path.stem}_{name}.png"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_point_table_lists_every_contender_in_both_dtypes(path):
    record = sweep.Sweep.load(path)
    table = sweep.point_table(record, "toy").splitlines()
    assert table[1].split() == ["fp32", "bf16"]
    width = len(table[1]) - 2 * len(" {:>10}".format(""))  # the names' column, as wide as the longest name
    assert width == max(len(r.name) for r in record.results if r.shape == "toy")
    rows = {line[:width].strip(): line[width:].split() for line in table[2:]}
    assert {len(line) for line in table[1:]} == {len(table[1])}, "columns out of line"
    assert set(rows) == {r.name for r in record.results if r.shape == "toy"}
    toy_step7 = record.find("step 7 (latency)", "toy", "bf16")
    assert rows["step 7 (latency)"][1] == f"{toy_step7.median_us:,.1f}"


def test_a_timing_table_keeps_its_columns_aligned_for_long_step_names():
    timings = [bench.Timing("step 2 (shared_latent)", "graph", 17.8, 17.7, 18.2, 10, 0),
               bench.Timing("eager", "graph", 25.1, 24.9, 26.8, 10, 0)]
    lines = bench.table(timings).splitlines()
    assert len({len(line) for line in lines}) == 1, lines
    assert lines[2].startswith("eager ") and lines[2].index("25.1") == lines[1].index("17.8")


def _point(name: str, us: float, dtype: str = "fp32", shape: str = "v2_lite@4096") -> sweep.Result:
    return sweep.Result(name, shape, 4096, dtype, "graph", "ok", median_us=us, rel_error=1e-6, of_floor=0.5)


def test_the_ffma_target_is_judged_on_ffma_steps_only():
    # Not on step 10, which takes fp32 in three TF32 passes on the tensor cores.
    record = sweep.Sweep({}, [_point("step 4 (vectorized)", 723.9), _point("step 10 (three_passes)", 270.3),
                              _point("cuBLAS concat", 547.4)])
    ffma = next(t for t in sweep.targets(record) if "FFMA" in t.goal)
    assert ffma.measured.startswith("step 4 (vectorized)") and ffma.met is False
    assert sweep.best_step(record, "v2_lite@4096", "fp32", "graph", "fp32").name == "step 10 (three_passes)"
    assert [s.number for s in steps.STEPS if s.fp32_tensor_passes == 3] == [8, 10, 11]
    assert all((s.fp32_math == "tf32") == (s.fp32_tensor_passes == 1) for s in steps.STEPS)


def test_a_point_table_orders_steps_by_number():
    record = sweep.Sweep({}, [_point(name, 1.0, shape="toy") for name in
                              ("eager", "step 10 (three_passes)", "step 2 (shared_latent)", "step 9 (tf32_wgmma)")])
    assert [line[:24].strip() for line in sweep.point_table(record, "toy").splitlines()[2:]] == [
        "step 2 (shared_latent)", "step 9 (tf32_wgmma)", "step 10 (three_passes)", "eager"]


def test_a_three_pass_steps_floor_is_three_times_the_tensor_work_at_the_tf32_rate():
    shape = sweep.SHAPES["v2_lite@4096"]
    ceilings = {"bf16 matmul TFLOP/s": 680.0, "fp32 matmul TFLOP/s": 51.0, "tf32 matmul TFLOP/s": 350.0, "copy TB/s": 4.2}
    ffma, one, three = (bench.floor_us(shape, torch.float32, ceilings, passes) for passes in (0, 1, 3))
    assert three == pytest.approx(3 * one) and ffma > three
    assert three == pytest.approx(3 * shape.flops() / 350e12 * 1e6)


_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")
# A time or a speed ratio as prose quotes it: "51.1 µs", "0.97x", "1.5×" (not a size such as "64 × 128").
_QUOTED = re.compile(r"(?<![\w.,])(\d[\d,]*(?:\.\d+)?)(?:\s?µs|[x×](?!\w))")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_time_a_notebook_quotes_is_printed_by_its_checked_cells_or_was_predicted(path):
    """The times and ratios in a notebook's prose come from the stored results (cells marked
    NBVAL_CHECK_OUTPUT, whose outputs nbval holds to the JSON on any machine) or from a prediction
    cell; a number from a run on one GPU would go stale on the next run, or on another GPU."""
    cells = json.loads(path.read_text())["cells"]
    printed = set()
    for cell in cells:
        source = "".join(cell["source"])
        if cell["cell_type"] == "code" and source.startswith("# NBVAL_CHECK_OUTPUT"):
            printed |= {n for output in cell["outputs"] for n in _NUMBER.findall("".join(output.get("text", "")))}
        if cell["cell_type"] == "markdown" and "**Prediction" in source:
            printed |= set(_NUMBER.findall(source))
    for index, cell in enumerate(cells):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "**Prediction" not in source:
            unprinted = [n for n in _QUOTED.findall(source) if n not in printed]
            assert not unprinted, f"{path.name}, cell {index} quotes {unprinted}, which no checked cell printed"


def test_a_target_is_met_only_when_the_steps_slow_end_beats_it():
    """A median 2 % ahead of cuBLAS with a p90 behind it is inside the run-to-run spread: not met."""
    def timed(name, median, p90):
        return sweep.Result(name, "v3@16384", 16384, "bf16", "graph", "ok", median_us=median, p10_us=median,
                            p90_us=p90, rel_error=2e-3)

    def met(step_p90):
        record = sweep.Sweep({}, [timed("step 6 (hopper)", 1079.0, step_p90), timed("cuBLAS concat", 1100.0, 1140.0),
                                  timed("eager", 1840.0, 1900.0)])
        return next(t for t in sweep.targets(record) if t.goal == "v3@16384 bf16: best step >= 1.0x cuBLAS concat").met

    assert met(1090.0) is True
    assert met(1110.0) is False
