"""Stored profiles (mla_lab.profile): ncu's CSV read into one summary per call, and the sentence
on what moved, on planted numbers."""

import pytest

from mla_lab import profile

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def row(kernel_id: int, name: str, metric: str, unit: str, value: str) -> str:
    return (f'"{kernel_id}","4242","python3","127.0.0.1","{name}","1","7","(256, 1, 1)","(128, 8, 1)","0","9.0",'
            f'"Command line profiler metrics","{metric}","{unit}","{value}"')


MARKER = "at::cuda::(anonymous namespace)::spin_kernel(long)"
PLANTED = "\n".join([
    "==PROF== Connected to process 4242",
    HEADER,
    row(0, MARKER, "gpu__time_duration.sum", "usecond", "1.10"),
    row(1, "stream_tokens<bf16, 1>", "gpu__time_duration.sum", "usecond", "6.82"),
    row(1, "stream_tokens<bf16, 1>", "dram__bytes_read.sum", "Mbyte", "2.10"),
    row(1, "stream_tokens<bf16, 1>", "launch__registers_per_thread", "register/thread", "48"),
    row(1, "stream_tokens<bf16, 1>", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%", "2.0"),
    row(1, "stream_tokens<bf16, 1>", profile.STALL_METRIC.format("barrier"), "", "3.5"),
    row(2, "stream_tokens<bf16, 1>", "gpu__time_duration.sum", "ns", "7,550"),
    row(2, "stream_tokens<bf16, 1>", "dram__bytes_read.sum", "Mbyte", "4.20"),
    row(2, "stream_tokens<bf16, 1>", "launch__registers_per_thread", "register/thread", "43"),
    row(2, "stream_tokens<bf16, 1>", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "%", "4.0"),
    row(2, "stream_tokens<bf16, 1>", profile.STALL_METRIC.format("long_scoreboard"), "", "9.0"),
    row(3, MARKER, "gpu__time_duration.sum", "usecond", "1.10"),
    row(4, "transpose_weights<float>", "gpu__time_duration.sum", "usecond", "3.00"),
    "==PROF== Disconnected from process 4242",
])


def test_ncu_csv_becomes_one_summary_per_call():
    kernels = profile.parse(PLANTED)
    assert [name for name, _ in kernels] == [MARKER, "stream_tokens<bf16, 1>", "stream_tokens<bf16, 1>", MARKER,
                                            "transpose_weights<float>"]
    first, second = profile.split_calls(kernels)
    assert len(first) == 2 and first[1]["gpu__time_duration.sum"] == 7.55 and len(second) == 1
    summary = profile.summarize(first)
    assert summary["kernels"] == 2 and round(summary["duration_us"], 2) == 14.37
    assert summary["kernel_us"] == [6.82, 7.55]
    assert round(summary["dram_read_bytes"]) == 6_300_000 and summary["registers"] == 48
    assert round(summary["tensor_pipe_pct"], 2) == round((2.0 * 6.82 + 4.0 * 7.55) / 14.37, 2)
    assert list(k for k in summary if k.startswith("stall"))[0] == "stall long_scoreboard"
    assert profile.summarize(second)["duration_us"] == 3.0


def test_kernels_before_any_marker_are_refused():
    with pytest.raises(RuntimeError, match="not with a call's marker"):
        profile.split_calls(profile.parse(PLANTED)[1:])


def test_what_moved_is_one_sentence():
    before = {"duration_us": 100.0, "dram_read_bytes": 81e6, "bank_conflicts": 0.0, "tensor_pipe_pct": 0.0,
              "fma_pipe_pct": 70.0, "occupancy_pct": 40.0}
    after = {**before, "duration_us": 25.0, "dram_read_bytes": 10e6, "tensor_pipe_pct": 61.0, "fma_pipe_pct": 5.0}
    assert profile.moved(before, after) == ("time 4.0x shorter, DRAM reads 8.1x fewer, the tensor pipe from 0 to 61 %, "
                                            "the FMA pipe from 70 to 5 %")
    assert profile.moved(before, before) == "no counter moved by more than a quarter"


def test_a_refusal_is_named_in_one_line():
    assert "ERR_NVGPUCTRPERM" in profile.why_not("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission")
    assert profile.why_not("==ERROR== Failed to initialize the profiler: LibraryNotLoaded").startswith("Nsight Compute cannot")


def test_a_summary_reads_in_words_and_an_impossible_hit_rate_is_flagged():
    summary = profile.summarize(profile.split_calls(profile.parse(PLANTED))[0])
    words = profile.describe(summary)
    assert words.startswith("14.4 µs in 2 kernels (6.8 + 7.5); DRAM 6.30 MB read") and "top stalls (cycles per issue): long_scoreboard" in words
    assert "unreliable" not in words
    assert "L2 hit 119 % (counts from different replays disagree: unreliable)" in profile.describe({**summary, "l2_hit_pct": 118.9})
    stored_before_kernel_times = {k: v for k, v in summary.items() if k != "kernel_us"}
    assert profile.describe(stored_before_kernel_times).startswith("14.4 µs in 2 kernels; DRAM")
