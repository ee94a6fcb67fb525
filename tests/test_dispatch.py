"""`mla_lab.project`'s rules against the sweep they were read from: at every point of the newest
sweep of that device, the step the rules pick is the fastest course step there, or within
dispatch.SLACK.
fp32 points compare only steps that keep fp32's accuracy (project never trades it for speed);
project called without prepared weights is compared with the steps called the same way."""

import pytest

from mla_lab import dispatch, steps, sweep

SWEEP_PATHS = sorted(sweep.RESULTS_DIR.glob(f"{dispatch.RULES_FROM}.json"))


def picked_row(record: sweep.Sweep, point: str, dtype_name: str, prepared: bool = False) -> sweep.Result:
    """The sweep's row for the step the rules pick at one point, asked with whether a step's own
    kernel takes the inputs read off that step's row there ("ok", not "skipped"); given prepared
    weights, the row of that step called with them where it has a layout of its own."""
    shape, on_hopper = sweep.SHAPES[point], record.meta["compute_capability"] == "9.0"

    def takes(number):
        return record.find(steps.get(number).label, point, dtype_name).status == "ok"

    picked = steps.get(dispatch.rule(shape.tokens, shape.rank, shape.heads * shape.head_dim, sweep.DTYPES[dtype_name],
                                     lambda: on_hopper, takes, prepared))
    with_layout = prepared and picked.number == dispatch.PREPARED_STEP
    return record.find(picked.label + (sweep.PREPARED_SUFFIX if with_layout else ""), point, dtype_name)


@pytest.mark.skipif(not SWEEP_PATHS, reason=f"no results/{dispatch.RULES_FROM}.json in this checkout")
def test_the_rules_pick_the_fastest_step_at_every_point_of_their_sweep():
    """The rules as written now (dispatch.rule), asked at every point of the sweep, with whether a
    step's own kernel takes the inputs read off that step's row there ("ok", not "skipped"): the
    step they pick is within SLACK of the fastest course step called the same way."""
    record = sweep.Sweep.load(SWEEP_PATHS[0])
    slow = []
    for name in sweep.SHAPES:
        for dtype_name in sweep.DTYPES:
            result = picked_row(record, name, dtype_name)
            best = sweep.best_step(record, name, dtype_name, "graph", "fp32" if dtype_name == "fp32" else None,
                                   prepared=False)
            assert result.status == "ok", f"{name} {dtype_name}: the rules pick {result.name}, which ran its fallback"
            if result.median_us > dispatch.SLACK * best.median_us:
                slow.append(f"{name} {dtype_name}: {result.name} {result.median_us:.1f} µs, {best.name} {best.median_us:.1f}")
    assert not slow, "the rules pick a step slower than the fastest at: " + "; ".join(slow)


@pytest.mark.skipif(not SWEEP_PATHS, reason=f"no results/{dispatch.RULES_FROM}.json in this checkout")
def test_the_sweep_timed_project_at_every_point():
    record = sweep.Sweep.load(SWEEP_PATHS[0])
    assert len(sweep.dispatcher_ratios(record)) == len(sweep.SHAPES) * len(sweep.DTYPES), (
        "the sweep has no project result at some point")


@pytest.mark.skipif(not SWEEP_PATHS, reason=f"no results/{dispatch.RULES_FROM}.json in this checkout")
def test_the_rules_given_prepared_weights_pick_the_fastest_step_where_preparing_applies():
    """Where the sweep timed project with prepared weights (fp32 on Hopper), the step the rules
    pick given prepared weights, timed as project would call it (prepared where that step has a
    layout of its own), is within SLACK of the fastest fp32-accurate step there, prepared or not."""
    record = sweep.Sweep.load(SWEEP_PATHS[0])
    slow = []
    for _, timed in sweep.dispatcher_ratios(record, name=dispatch.PREPARED_NAME):
        result = picked_row(record, timed.shape, timed.dtype, prepared=True)
        name = result.name
        best = sweep.best_step(record, timed.shape, timed.dtype, "graph", "fp32")
        assert result.status == "ok", f"{timed.shape}: the rules given prepared weights pick {name}, which ran its fallback"
        if result.median_us > dispatch.SLACK * best.median_us:
            slow.append(f"{timed.shape}: {name} {result.median_us:.1f} µs, {best.name} {best.median_us:.1f}")
    assert not slow, "the rules given prepared weights pick a step slower than the fastest at: " + "; ".join(slow)


def test_the_dispatcher_asks_for_a_gpu_in_one_line_without_one():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    from mla_lab import TOY, make_inputs

    with pytest.raises(Exception) as error:
        dispatch.project(*make_inputs(TOY), TOY.heads)
    assert "\n" not in str(error.value) and "GPU" in str(error.value)


def test_the_dispatcher_table_names_the_step_it_ran_once_sweeps_record_it():
    import copy

    record = copy.deepcopy(sweep.newest())
    project_results = [r for r in record.results if r.name == dispatch.NAME and r.status == "ok"]
    for r in project_results:
        r.note = ""  # as sweeps recorded before they noted the step
    assert "step it ran" not in sweep.dispatcher_table(record).splitlines()[0]
    for r in project_results:
        r.note = "ran step 11 (decode)"
    lines = sweep.dispatcher_table(record).splitlines()
    assert lines[0].endswith("step it ran") and all(line.endswith("step 11 (decode)") for line in lines[1:])


@pytest.mark.parametrize("rank, step", [(520, 4), (640, 4), (641, 2), (12288, 2), (12289, 1)])
def test_latent_widths_past_the_tensor_core_tiles_go_to_the_fastest_step_that_takes_them(rank, step):
    import torch

    hidden = torch.empty(3, 8)
    weights = (torch.empty(8, rank), torch.empty(rank, 64), torch.empty(rank, 64))
    assert dispatch.choose(hidden, *weights) == step
    assert steps.get(step).max_rank is None or rank <= steps.get(step).max_rank
