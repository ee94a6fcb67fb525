"""A sweep cut short goes on from its checkpoint: the points measured are kept, only the others
are measured in the next sitting, and a checkpoint of other sources or another plan is not taken up."""

import json

import pytest

from mla_lab import bench, sweep


class Cut(Exception):
    """The time limit of a sitting, arriving after some points."""


@pytest.fixture
def fake_gpu(monkeypatch):
    """sweep.run without a GPU: each point's measurement is one made-up row, and `measured` lists
    the points measured; `state["sources"]` is the checkout's digest, `state["cut_after"]` ends a
    sitting after that many points."""
    state = {"sources": "aaaa", "cut_after": None, "measured": [], "sitting": 0}

    def measure_point(shape_name, shape, dtype_name, *args, seed, **kwargs):
        if state["cut_after"] is not None and len(state["measured"]) >= state["cut_after"]:
            raise Cut()
        state["measured"].append(f"{shape_name} {dtype_name}")
        return [bench.Result("eager", shape_name, shape.tokens, dtype_name, "graph", "ok", median_us=float(seed))]

    def device_meta(command, ceilings):
        state["sitting"] += 1
        return {"device": "Fake GPU", "sources": state["sources"], "date": f"2026-12-0{state['sitting']}T00:00:00+00:00",
                "command": command, "ceilings": ceilings}

    monkeypatch.setattr(bench, "measure_ceilings", lambda: {"copy TB/s": 3.0})
    monkeypatch.setattr(sweep, "device_meta", device_meta)
    monkeypatch.setattr(sweep, "_measure_point", measure_point)
    monkeypatch.setattr(sweep.steps, "load", lambda number: None)
    return state


SHAPES = ["toy", "v2_lite@1", "v2_lite@5"]


def sweep_in(path, resume):
    return sweep.run([1], SHAPES, ["fp32", "bf16"], ["graph"], peers=[], checkpoint=path, resume=resume,
                     progress=lambda line: None)


def test_a_sweep_cut_short_goes_on_where_it_stopped(tmp_path, fake_gpu):
    checkpoint = tmp_path / "fake.json"
    fake_gpu["cut_after"] = 4
    with pytest.raises(Cut):
        sweep_in(checkpoint, resume=True)
    first = list(fake_gpu["measured"])
    assert first == ["toy fp32", "toy bf16", "v2_lite@1 fp32", "v2_lite@1 bf16"]

    fake_gpu["cut_after"] = None
    record = sweep_in(checkpoint, resume=True)
    assert fake_gpu["measured"][len(first):] == ["v2_lite@5 fp32", "v2_lite@5 bf16"]  # none measured twice
    assert [(r.shape, r.dtype, r.median_us) for r in record.results] == [
        (shape, dtype, float(seed)) for seed, (shape, dtype) in
        enumerate(((s, d) for s in SHAPES for d in ("fp32", "bf16")), 1)]  # each point's own seed, as in one sitting
    assert [s["points"] for s in record.meta["sittings"]] == [first, ["v2_lite@5 fp32", "v2_lite@5 bf16"]]
    assert [len(s["seconds"]) for s in record.meta["sittings"]] == [4, 2]  # each point's own time
    assert record.meta["date"] == "2026-12-01T00:00:00+00:00"
    assert "in 2 sittings (2026-12-01, 2026-12-02)" in sweep._sittings_phrase(record.meta)
    one_day = {"sittings": [{"date": "2026-12-07T06:00:00+00:00"}, {"date": "2026-12-07T07:00:00+00:00"}]}
    assert sweep._sittings_phrase(one_day) == ", in 2 sittings"  # the table names that day already


@pytest.mark.parametrize("change", ["sources", "plan", "no resume"])
def test_a_checkpoint_is_taken_up_only_for_the_same_sources_and_plan(tmp_path, fake_gpu, change):
    checkpoint = tmp_path / "fake.json"
    fake_gpu["cut_after"] = 2
    with pytest.raises(Cut):
        sweep_in(checkpoint, resume=True)
    fake_gpu["cut_after"] = None
    fake_gpu["measured"].clear()
    if change == "sources":
        fake_gpu["sources"] = "bbbb"
    if change == "plan":
        record = sweep.run([1], SHAPES, ["fp32"], ["graph"], peers=[], checkpoint=checkpoint, resume=True,
                           progress=lambda line: None)
        assert fake_gpu["measured"] == [f"{s} fp32" for s in SHAPES]
    else:
        record = sweep_in(checkpoint, resume=change != "no resume")
        assert len(fake_gpu["measured"]) == 2 * len(SHAPES)
    assert len(record.meta["sittings"]) == 1


def test_a_sweep_in_one_sitting_says_nothing_of_sittings(tmp_path, fake_gpu):
    record = sweep_in(tmp_path / "fake.json", resume=False)
    assert sweep._sittings_phrase(record.meta) == ""
    assert (tmp_path / "fake.json").exists()  # bench removes it once the results are written


def test_a_sitting_with_a_budget_stops_between_points_and_the_next_goes_on(tmp_path, fake_gpu, monkeypatch):
    clock = iter(range(0, 1000, 10))  # each look at the clock: 10 s later
    monkeypatch.setattr(sweep.time, "monotonic", lambda: next(clock))
    checkpoint = tmp_path / "fake.json"
    with pytest.raises(sweep.SweepCutShort, match="with 2 of 6 points measured"):  # looks at 10, 30, 50 s
        sweep.run([1], SHAPES, ["fp32", "bf16"], ["graph"], peers=[], checkpoint=checkpoint, resume=True,
                  progress=lambda line: None, stop_after_s=45)
    assert fake_gpu["measured"] == ["toy fp32", "toy bf16"]
    cut_short = json.loads(checkpoint.read_text())["meta"]["sittings"]
    assert cut_short[0]["seconds"] == [10.0, 10.0]  # each point from its start to its end, on the one clock
    record = sweep_in(checkpoint, resume=True)
    assert len(record.results) == 6 and len(fake_gpu["measured"]) == 6


def test_a_finished_sweep_of_these_sources_leaves_nothing_to_go_on_with(tmp_path, monkeypatch):
    monkeypatch.setattr(sweep, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(sweep, "sources_fingerprint", lambda: "aaaa")
    assert sweep.whole_sweep_of_these_sources("Fake GPU") is None
    path = sweep.sweep_path_for({"device": "Fake GPU"})
    path.write_text(sweep.Sweep({"device": "Fake GPU", "sources": "bbbb"}).to_json())
    assert sweep.whole_sweep_of_these_sources("Fake GPU") is None  # another checkout's sweep: measure afresh
    path.write_text(sweep.Sweep({"device": "Fake GPU", "sources": "aaaa"}).to_json())
    assert sweep.whole_sweep_of_these_sources("Fake GPU") == path
    assert sweep.plan() == sweep.plan(None, None, ["fp32", "bf16"], ["graph", "stream"], list(sweep.PEERS))
