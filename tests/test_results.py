"""The committed benchmark results: complete, self-describing, and the README's table made from them."""

import json
import re

import matplotlib.pyplot as plt
import pytest
import torch

from mla_lab import bench, notebooks, plots, steps, sweep

SWEEPS = sweep.committed_sweeps()
NOTEBOOKS = sorted(notebooks.NOTEBOOK_DIR.glob("*.ipynb"))
META_FIELDS = {"device", "compute_capability", "driver", "torch", "cuda", "date", "command", "git_commit", "sources", "ceilings"}


def test_results_are_committed():
    assert SWEEPS, "results/ holds no sweep: run `make bench` on a GPU machine and commit results/"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_sweep_says_where_and_how_it_was_measured(path):
    record = sweep.Sweep.load(path)
    assert META_FIELDS <= set(record.meta), META_FIELDS - set(record.meta)
    assert set(record.meta["ceilings"]) == {"bf16 matmul TFLOP/s", "fp32 matmul TFLOP/s", "tf32 matmul TFLOP/s", "copy TB/s"}
    assert path == sweep.sweep_path_for(record.meta)


def test_the_newest_sweep_measured_the_sources_as_they_are():
    # Every number in the README, the plots and the notebooks comes from this file: a change to a
    # kernel or to mla_lab lands with a new sweep (`make bench`, `make notebooks`), or not at all.
    newest = max((sweep.Sweep.load(path) for path in SWEEPS), key=lambda record: record.meta["date"])
    assert newest.meta["sources"] == sweep.sources_fingerprint(), (
        f"results were measured on sources {newest.meta['sources']}, these are {sweep.sources_fingerprint()}: "
        "run `make bench` and `make notebooks` on a GPU machine and commit results/ and notebooks/"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_notebook_outputs_come_from_these_cells_on_the_measured_sources(path):
    rerun = "run `make notebooks` on a GPU machine and commit notebooks/"
    notebook = json.loads(path.read_text())
    ran_on = notebook["metadata"].get(notebooks.STAMP, {}).get("sources")
    assert ran_on == sweep.sources_fingerprint(), (
        f"{path.name} was executed on sources {ran_on}, these are {sweep.sources_fingerprint()}: {rerun}")
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


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_sweep_covers_every_step_peer_shape_dtype_and_mode(path):
    record = sweep.Sweep.load(path)
    names = {s.label for s in steps.STEPS} | set(sweep.PEERS)
    seen = {(r.name, r.shape, r.dtype, r.mode) for r in record.results}
    for name in names:
        for shape in sweep.SHAPES:
            for dtype in sweep.DTYPES:
                if name == "cuBLAS concat TF32" and dtype == "bf16":
                    continue
                for mode in ("graph", "stream"):
                    assert (name, shape, dtype, mode) in seen, (name, shape, dtype, mode)
    assert not [r for r in record.results if r.status == "wrong"], "a contender was wrong when measured"
    # A contender that cannot run at a point is skipped there, with the reason; one that failed
    # means the sweep (or the contender) is broken, and its numbers are not the course's.
    assert not [r for r in record.results if r.status == "failed"], "a contender failed in the sweep"
    for r in record.results:
        if r.status == "ok":
            assert r.median_us > 0 and r.samples >= 10 and r.p10_us <= r.median_us <= r.p90_us, r
        else:
            assert r.status == "skipped" and r.note, r


def test_the_readme_table_is_the_one_the_results_give():
    record = sweep.Sweep.load(SWEEPS[0])
    readme = sweep.README.read_text()
    assert sweep.readme_with_table(readme, sweep.results_table(record)) == readme, (
        "README.md's results table differs from results/*.json: run `python -m mla_lab results`"
    )


def test_the_readme_says_it_validated_the_measured_sources():
    # The prose under the table is written by hand after each GPU run; it once went on naming the
    # sources of the sweep before (stop 27 found it). Its validation paragraph names the sources
    # it ran on: they must be the table's.
    record = sweep.Sweep.load(SWEEPS[0])
    readme = sweep.README.read_text()
    validated = re.search(r"Validated on .*? on the measured sources \(fingerprint\s+([0-9a-f]{12})\)", readme, re.S)
    assert validated, "README.md has no paragraph saying which sources were validated on a GPU"
    assert validated.group(1) == record.meta["sources"], (
        f"README.md says it validated sources {validated.group(1)}, but its table measured "
        f"{record.meta['sources']}: update the prose under the table from the new run"
    )


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_the_plots_are_drawn_from_the_json_and_committed(path):
    figures = plots.sweep_figures(sweep.Sweep.load(path))
    assert set(figures) == {f"{kind}_{dtype}" for kind in ("speed_vs_tokens", "roofline") for dtype in ("bf16", "fp32")}
    plt.close("all")
    for name in figures:
        assert path.with_name(f"{path.stem}_{name}.png").exists(), f"run `python -m mla_lab results` and commit {path.stem}_{name}.png"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.name)
def test_a_point_table_lists_every_contender_in_both_dtypes(path):
    record = sweep.Sweep.load(path)
    table = sweep.point_table(record, "toy").splitlines()
    assert table[1].split() == ["fp32", "bf16"]
    rows = {line[:24].strip(): line[24:].split() for line in table[2:]}
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
    # Stop 29's sweep judged it on step 10, which takes fp32 in three TF32 passes on the tensor cores.
    record = sweep.Sweep({}, [_point("step 4 (vectorized)", 723.9), _point("step 10 (three_passes)", 270.3),
                              _point("cuBLAS concat", 547.4)])
    ffma = next(t for t in sweep.targets(record) if "FFMA" in t.goal)
    assert ffma.measured.startswith("step 4 (vectorized)") and ffma.met is False
    assert sweep.best_step(record, "v2_lite@4096", "fp32", "graph", "fp32").name == "step 10 (three_passes)"
    assert [s.number for s in steps.STEPS if s.fp32_tensor_passes == 3] == [8, 10]
    assert all((s.fp32_math == "tf32") == (s.fp32_tensor_passes == 1) for s in steps.STEPS)


def test_a_point_table_orders_steps_by_number():
    record = sweep.Sweep({}, [_point(name, 1.0, shape="toy") for name in
                              ("eager", "step 10 (three_passes)", "step 2 (shared_latent)", "step 9 (tf32_wgmma)")])
    assert [line[:24].strip() for line in sweep.point_table(record, "toy").splitlines()[2:]] == [
        "step 2 (shared_latent)", "step 9 (tf32_wgmma)", "step 10 (three_passes)", "eager"]


def test_a_three_pass_steps_floor_is_three_times_the_tensor_work_at_the_tf32_rate():
    shape = sweep.SHAPES["v2_lite@4096"]
    ceilings = {"bf16 matmul TFLOP/s": 680.0, "fp32 matmul TFLOP/s": 51.0, "tf32 matmul TFLOP/s": 350.0, "copy TB/s": 4.2}
    ffma, one, three = (sweep._floor_us(shape, torch.float32, ceilings, passes) for passes in (0, 1, 3))
    assert three == pytest.approx(3 * one) and ffma > three
    assert three == pytest.approx(3 * shape.flops() / 350e12 * 1e6)
