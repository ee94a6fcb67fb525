"""The grader's speed clause: at which point each ratio is, and which points those are."""


def test_the_grader_says_at_which_point_each_ratio_is():
    from mla_lab import steps, sweep
    from mla_lab.grade import IDEA_POINTS, speed_at

    line = speed_at("v2_lite@4096 fp32", {"step 4 (vectorized)": 724.4, "step 3 (tiled)": 5009.9, "eager": 599.4},
                    steps.get(4), steps.get(3))
    assert line == "v2_lite@4096 fp32 724.4 us, 6.92x step 3, 0.83x eager (599.4 us)"
    for number, point in IDEA_POINTS.items():
        shape, dtype = point.split()
        assert steps.get(number).is_exercise and shape in sweep.SHAPES and dtype in sweep.DTYPES
