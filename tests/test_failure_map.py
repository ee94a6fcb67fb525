"""The grader's failure map: planted wrong outputs, and the one line that says where they are wrong."""

import pytest
import torch

from mla_lab import check, failure_map
from mla_lab.problem import TOY, make_inputs, oracle


@pytest.fixture(scope="module")
def expected():
    return oracle(make_inputs(TOY, torch.float32, seed=3), TOY.heads)


def where(got, expected):
    return failure_map.describe(got, expected, TOY, check.TOLERANCE[torch.float32])


def planted(expected, change):
    got = expected.clone()
    change(got)
    return got


def test_one_half_of_each_head_in_v_only(expected):
    got = planted(expected, lambda g: g[:, :, 1, :, 16:].mul_(1.5))
    line = where(got, expected)  # a few elements near zero stay within the slack
    assert line.startswith("wrong on 25 % of elements (245")
    assert line.endswith(" of 98304, wrong values): v only, all 4 heads, columns 16-31 of each head, "
                         "all 96 positions of every sequence")


def test_a_missing_tail_guard_leaves_the_last_positions_unwritten(expected):
    got = planted(expected, lambda g: g[:, 90:].fill_(float("nan")))
    line = where(got, expected)
    assert "never written (still NaN)" in line and "positions 90-95 of every sequence" in line
    assert "k and v, all 4 heads, all 32 columns" in line


def test_one_head_and_one_sequence_are_named(expected):
    got = planted(expected, lambda g: g[2, :, 0, 3].zero_())
    assert where(got, expected).endswith(": k only, head 3, all 32 columns of each head, sequence 2, "
                                         "all 96 positions")


def test_never_written_and_wrong_values_are_told_apart(expected):
    got = planted(expected, lambda g: (g[0, 0, 0, 0, 0].fill_(float("nan")), g[1, 1, 1, 1, 1].fill_(1e3)))
    assert "(2 of 98304, 1 never written, the rest wrong values)" in where(got, expected)


def test_scattered_elements_are_counted_not_listed(expected):
    got = planted(expected, lambda g: g[:, ::7, 0, 0, 0].add_(100.0))
    assert "positions 14 scattered of every sequence" in where(got, expected)


def test_noise_spread_over_every_element_maps_to_nothing(expected):
    # uniform noise of twice the tolerance in norm: no element off by more than 3.5x the tolerance
    noise = 2 * torch.rand(expected.shape, generator=torch.Generator().manual_seed(0), dtype=expected.dtype) - 1
    got = expected + 2 * 3**0.5 * check.TOLERANCE[torch.float32] * noise * expected.pow(2).mean().sqrt()
    assert check.compare(got.float(), expected, torch.float32, TOY).problem  # wrong by the norm ...
    assert where(got, expected) is None  # ... yet no element stands out


def test_a_scale_error_maps_to_everywhere(expected):
    assert where(expected * (1 + 1e-3), expected).endswith(
        "k and v, all 4 heads, all 32 columns of each head, all 96 positions of every sequence")


def test_the_check_says_where(expected):
    got = planted(expected, lambda g: g[:, :, 1, :, 16:].mul_(1.5))
    verdict = check.compare(got.float(), expected, torch.float32, TOY)
    assert "k is right but v is wrong" in verdict.problem and "columns 16-31 of each head" in verdict.problem


def test_the_map_is_drawn_without_a_gpu(expected):
    import matplotlib.pyplot as plt

    from mla_lab import plots

    got = planted(expected, lambda g: g[:, 90:].fill_(float("nan")))
    figure = plots.failure_map(got, expected, TOY, check.TOLERANCE[torch.float32])
    assert "never written" in figure.axes[0].get_title()
    plt.close(figure)
