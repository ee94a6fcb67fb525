"""Every step on the GPU: the shape matrix in both dtypes, graphs, streams, and bad inputs."""

import ctypes
import math
import re

import pytest
import torch

from mla_lab.abi import MLA_BFLOAT16, MLA_FLOAT32, MlaProblem
from mla_lab import bench, check, dispatch, steps, sweep
from mla_lab.grade import IDEA_POINTS, grade
from mla_lab.problem import TOY, Inputs, Shape, make_inputs, oracle

pytestmark = pytest.mark.gpu
STEP_KEYS = [s.number for s in steps.STEPS]


@pytest.fixture(scope="module", params=STEP_KEYS, ids=lambda n: f"step{n}")
def kernel(request):
    return steps.load(request.param)


def test_correct_on_the_whole_shape_matrix(kernel):
    verdicts = check.check_matrix(kernel, "cuda")
    assert all(v.ok for v in verdicts), "\n".join(str(v) for v in verdicts if not v.ok)


def test_allocates_the_stacked_shape_with_the_inputs_dtype(kernel):
    inputs = make_inputs(TOY, torch.bfloat16, "cuda")
    out = kernel(*inputs, TOY.heads)
    assert out.shape == TOY.out_shape and out.dtype == torch.bfloat16 and out.is_contiguous()


def test_captured_in_a_cuda_graph_and_replayed_on_new_inputs(kernel):
    static = make_inputs(TOY, torch.float32, "cuda", seed=1)
    out = torch.empty(TOY.out_shape, device="cuda")
    kernel(*static, TOY.heads, out=out)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(*static, TOY.heads, out=out)
    fresh = make_inputs(TOY, torch.float32, "cuda", seed=2)
    for buffer, value in zip(static, fresh):
        buffer.copy_(value)
    out.fill_(float("nan"))
    graph.replay()
    assert check.compare(out, oracle(fresh, TOY.heads), torch.float32, TOY, check.tolerance(kernel, torch.float32)).ok


def test_runs_on_the_current_stream(kernel):
    inputs = make_inputs(TOY, torch.float32, "cuda", seed=3)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000)  # keep the stream busy: a launch elsewhere would race ahead
        out = kernel(*inputs, TOY.heads)
    stream.synchronize()
    assert check.compare(out, oracle(inputs, TOY.heads), torch.float32, TOY, check.tolerance(kernel, torch.float32)).ok


def test_zero_tokens_give_an_empty_output_of_the_right_shape(kernel):
    shape = TOY.with_tokens(0, 96)
    out = kernel(*make_inputs(shape, torch.float32, "cuda"), TOY.heads)
    assert out.shape == (0, 96, 2, TOY.heads, TOY.head_dim)


def _replace(index, change):
    """Toy inputs with input `index` changed: a bad call the binding must reject."""

    def make():
        args = list(make_inputs(TOY, torch.float32, "cuda"))
        args[index] = change(args[index])
        return args

    return make


# case: (make the inputs, heads, what the one-line RuntimeError must say)
BAD_INPUTS = {
    "fp16": (_replace(0, torch.Tensor.half), 4, "supported dtypes are float32 and bfloat16"),
    "mixed dtypes": (_replace(1, torch.Tensor.bfloat16), 4, "convert all inputs to one dtype"),
    "non-contiguous": (_replace(2, lambda w: w.t().contiguous().t()), 4, "w_up_k.contiguous()"),
    "hidden rank 2": (_replace(0, lambda x: x[0]), 4, "hidden must be .batch, seq, d_model."),
    "d_model mismatch": (_replace(1, lambda w: w[1:]), 4, "w_down must be .d_model, rank."),
    "rank mismatch": (_replace(2, lambda w: w[1:]), 4, "w_up_k must be .rank, heads.head_dim."),
    "k/v width mismatch": (_replace(3, lambda w: w[:, 1:].contiguous()), 4, "same shape"),
    "heads do not divide": (_replace(0, lambda x: x), 5, "does not divide"),
    "heads zero": (_replace(0, lambda x: x), 0, "heads must be >= 1"),
    "cpu hidden": (_replace(0, torch.Tensor.cpu), 4, "with .cuda"),
    "mixed devices": (_replace(1, torch.Tensor.cpu), 4, "put all inputs on one GPU"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_clear_line(kernel, case):
    make, heads, message = BAD_INPUTS[case]
    with pytest.raises(RuntimeError, match=message) as raised:
        kernel(*make(), heads)
    assert "\n" not in str(raised.value).strip()


def test_a_wrong_out_is_rejected(kernel):
    inputs = make_inputs(TOY, torch.float32, "cuda")
    with pytest.raises(RuntimeError, match="out is"):
        kernel(*inputs, TOY.heads, out=torch.empty(1, device="cuda"))
    strided = torch.empty(*TOY.out_shape[:-1], 2 * TOY.head_dim, device="cuda")[..., ::2]
    with pytest.raises(RuntimeError, match="out is not contiguous"):
        kernel(*inputs, TOY.heads, out=strided)
    with pytest.raises(RuntimeError, match="out is BFloat16"):
        kernel(*inputs, TOY.heads, out=torch.empty(TOY.out_shape, device="cuda", dtype=torch.bfloat16))


def test_a_rank_beyond_the_launch_limit_is_rejected_naming_it(kernel):
    limit = kernel.step.max_rank
    if limit is None:
        pytest.skip(f"{kernel.step.label} has no launch limit")
    past = Shape(1, 2, 8, limit + 8, 1, 64)
    with pytest.raises(ValueError, match=re.escape(f"{kernel.step.label} takes rank <= {limit}")):
        kernel(*make_inputs(past, torch.bfloat16, "cuda"), 1)
    at_limit = Shape(1, 2, 8, limit, 1, 64)
    assert check.check(kernel, at_limit, torch.bfloat16, "cuda", trials=1).ok


def test_step6_takes_its_wgmma_path_where_it_applies():
    kernel = steps.load("hopper")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 6's wgmma path needs an sm_90 GPU; elsewhere it runs step 5")
    fast = [s for s in check.SHAPE_MATRIX if kernel.takes_fast_path(*make_inputs(s, torch.bfloat16, "cuda"))]
    # the toy, one token, V2-Lite, V3, a cluster of two, several latent tiles per block, ...
    assert len(fast) >= 8, [s.label() for s in fast]
    assert not kernel.takes_fast_path(*make_inputs(TOY, torch.float32, "cuda"))
    for shape in fast:
        assert check.check(kernel, shape, torch.bfloat16, "cuda", trials=1).ok


def test_step8_runs_its_own_kernel_exactly_where_it_takes_the_inputs():
    """kernels/08_bulk_mma.cu's mla_takes (its sizes, and the shared-memory plan) is the one rule:
    where it says yes, step 8's own launcher runs and is correct; where it says no, that launcher
    refuses (called straight, without the fallback to step 7). Shapes on both sides of its
    shared-memory limit too."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 8's own kernel needs an sm_90 GPU; elsewhere it runs step 7")
    step8 = steps.load(8)
    own = steps.Kernel(steps.get(7), step8.source, step8.library)  # no fallback: the launcher alone
    near_limit = [Shape(1, 40, d, r, 2, 64) for d in (256, 512) for r in (64, 96, 112, 128, 144, 176)]
    shapes = [*check.SHAPE_MATRIX, Shape(3, 37, 256, 48, 4, 32), Shape(2, 9, 128, 64, 3, 24), *near_limit]
    assert _own_kernel_runs_exactly_where_it_takes_the_inputs(step8, own, shapes) >= 10


def _offset_by_one(t: torch.Tensor) -> torch.Tensor:
    """A copy of t one element past its allocation's 16-byte alignment."""
    buffer = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    return buffer[1:].view(t.shape).copy_(t)


def _own_kernel_runs_exactly_where_it_takes_the_inputs(step, own, shapes) -> int:
    """Where `step`'s mla_takes says yes, `own` (its launcher without the fallback) is correct; where
    it says no, `own` refuses. Returns how many of the shapes x dtypes took the step's own kernel."""
    taken = 0
    for shape in shapes:
        for dtype in (torch.float32, torch.bfloat16):
            inputs = make_inputs(shape, dtype, "cuda")
            if step.takes_fast_path(*inputs):
                taken += 1
                assert check.check(own, shape, dtype, "cuda", trials=1).ok, (shape, dtype)
            else:
                with pytest.raises(RuntimeError, match="not supported"):
                    own(*inputs, shape.heads)
    return taken


def test_step12_runs_its_own_kernel_exactly_where_it_takes_the_inputs():
    """kernels/12_weight_stream.cu's mla_takes (up to 16 tokens, in bf16 up to 512 where its wgmma
    tiles fit, in fp32 up to 64 on its TF32 tile; its sizes, its shared memory) is the one rule:
    where it says yes, step 12's own launcher runs and is correct; where it says no, that launcher
    refuses (called straight, without the fallback to step 4). Every token count it compiles for, on
    both sides of its limits, at real widths and at odd ones."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 12's own kernel needs an sm_90 GPU; elsewhere it runs step 4")
    step = steps.load(12)
    own = steps.Kernel(steps.get(4), step.source, step.library)
    token_counts = (1, 2, 3, 5, 9, 16, 17, 64, 65, 200, 256, 257, 300, 512, 513)
    shapes = [*check.SHAPE_MATRIX, *(check.V2_LITE.with_tokens(1, t) for t in token_counts),
              *(check.V3.with_tokens(1, t) for t in (1, 37, 64)),  # d_model 7,168; 512 GEMM 2 tiles, above the SMs
              Shape(1, 16, 7168, 512, 16, 128), Shape(2, 3, 40, 8, 1, 8), Shape(1, 12, 4000, 136, 5, 24),
              Shape(1, 9, 200, 64, 2, 32),
              Shape(1, 45, 1499, 136, 3, 40)]  # past 16 tokens with an odd d_model: hidden's rows are no 16-byte runs
    assert _own_kernel_runs_exactly_where_it_takes_the_inputs(step, own, shapes) >= 16
    shape = check.V2_LITE.with_tokens(1, 64)  # TMA reads hidden's token tiles: 16-byte aligned rows only
    hidden, *weights = make_inputs(shape, torch.bfloat16, "cuda")
    shifted = _offset_by_one(hidden)
    assert step.takes_fast_path(hidden, *weights) and not step.takes_fast_path(shifted, *weights)
    assert check.compare(step(shifted, *weights, shape.heads), oracle((hidden, *weights), shape.heads),
                         torch.bfloat16, shape, check.tolerance(step, torch.bfloat16)).ok


@pytest.mark.parametrize("number, plain", [(9, 5), (10, 4)])
def test_steps_9_and_10_run_their_own_kernel_exactly_where_they_take_the_inputs(number, plain):
    """kernels/09_tf32_wgmma.cu's mla_takes is the one rule: where it says yes,
    the step's own launcher runs and is correct at the step's tolerance; where it says no (bf16, a
    d_model or rank no multiple of 4, hidden not 16-byte aligned), that launcher refuses, called
    straight, without the fallback. `plain` is a step without a fallback whose tolerance and
    limits the step shares (its fallback's)."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"step {number}'s own kernel needs an sm_90 GPU; elsewhere it runs step {plain}")
    step = steps.load(number)
    own = steps.Kernel(steps.get(plain), step.source, step.library)
    assert own.fp32_math == step.fp32_math
    assert _own_kernel_runs_exactly_where_it_takes_the_inputs(step, own, check.SHAPE_MATRIX) >= 10
    shape = Shape(1, 7, 64, 16, 2, 8)
    hidden, *weights = make_inputs(shape, torch.float32, "cuda")
    shifted = _offset_by_one(hidden)  # 4 bytes past 16
    assert not step.takes_fast_path(shifted, *weights)
    with pytest.raises(RuntimeError, match="not supported"):
        own(shifted, *weights, shape.heads)
    assert check.compare(step(shifted, *weights, shape.heads), oracle(make_inputs(shape, torch.float32, "cuda"), shape.heads),
                         torch.float32, shape, check.tolerance(step, torch.float32)).ok


@pytest.mark.parametrize("shape, split", [(check.STEP6_EXCHANGE, False), (check.STEP6_SPLIT, True)])
def test_step6_groups_split_the_latent_through_a_workspace_also_in_graph_replays(shape, split):
    """Groups exchanging bf16 latent slices; with `split`, also fp32 sums of d_model parts: the
    workspace holds those sums (twice the bf16 scratch) beside counters of under 4 KB."""
    kernel = steps.load("hopper")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("step 6's wgmma path needs an sm_90 GPU; elsewhere it runs step 5")
    static = make_inputs(shape, torch.bfloat16, "cuda", seed=1)
    out = torch.empty(shape.out_shape, dtype=torch.bfloat16, device="cuda")
    problem = MlaProblem(*(t.data_ptr() for t in (*static, out)), shape.tokens, shape.d_model, shape.rank,
                         shape.heads, shape.head_dim, MLA_BFLOAT16, None)
    workspace_bytes = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.POINTER(MlaProblem))(kernel._workspace_address)
    scratch = math.ceil(shape.tokens / 128) * 128 * math.ceil(shape.rank / 128) * 128 * 2
    counters = workspace_bytes(ctypes.byref(problem)) - scratch - (2 * scratch if split else 0)
    assert 0 < counters < 4096, f"this shape should take the {'split' if split else 'exchange'} path"
    kernel(*static, shape.heads, out=out)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(*static, shape.heads, out=out)
    for seed in (2, 3):  # each replay must find the counters (and sums) zeroed again
        fresh = make_inputs(shape, torch.bfloat16, "cuda", seed=seed)
        for buffer, value in zip(static, fresh):
            buffer.copy_(value)
        out.fill_(float("nan"))
        graph.replay()
        verdict = check.compare(out, oracle(fresh, shape.heads), torch.bfloat16, shape, check.tolerance(kernel, torch.bfloat16))
        assert verdict.ok, verdict


@pytest.mark.parametrize("exercise", [s.exercise for s in steps.exercises()])
def test_every_solution_grades_correct(exercise):
    result = grade(exercise, "solution")
    if result.status == "needs hopper":
        pytest.skip(result.line)
    assert result.passed, result.line
    # Timed at the toy in the dtype of the step's idea point (step 6 takes bf16 only), else fp32.
    idea = IDEA_POINTS.get(steps.get(exercise).number)
    timed = idea.split()[1] if idea else "fp32"
    assert f"toy {timed} " in result.line, result.line


def test_outputs_beyond_2_31_elements_are_indexed_correctly(kernel):
    # 2 * 128 outputs per token: token 2**23 starts exactly at element 2**31 of the output
    # (rank 8: step 6 takes its own path in bf16)
    shape = Shape(1, 2**23 + 3, 8, 8, 4, 32)
    assert shape.tokens * 2 * shape.width > 2**31
    inputs = make_inputs(shape, torch.bfloat16, "cuda")
    out = torch.full(shape.out_shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    kernel(*inputs, shape.heads, out=out)
    assert not bool(out.isnan().any()), "elements left unwritten"
    for first in (0, 2**23 - 2):  # the first tokens, and the tokens on both sides of 2**31
        rows = slice(first, first + 5)
        part = Inputs(inputs.hidden[:, rows], *inputs[1:])
        verdict = check.compare(out[:, rows], oracle(part, shape.heads), torch.bfloat16, shape.with_tokens(1, 5))
        assert verdict.ok, f"tokens {first}..{first + 4}: {verdict}"


def test_views_that_break_16_byte_alignment_are_correct(kernel):
    shape = Shape(2, 33, 129, 20, 3, 12)
    inputs = make_inputs(shape, torch.float32, "cuda", seed=5)
    shifted = Inputs(*(_offset_by_one(t) for t in inputs))
    assert all(t.data_ptr() % 16 for t in shifted)
    verdict = check.compare(kernel(*shifted, shape.heads), oracle(inputs, shape.heads), torch.float32, shape,
                            check.tolerance(kernel, torch.float32))
    assert verdict.ok, verdict


@pytest.mark.parametrize("dtype_name", ["bf16", "fp32"])
def test_a_sweep_point_times_every_contender_it_checked(dtype_name):
    """The sweep checks every contender, then times them against each other: each comes out "ok"
    (once a late-bound lambda timed every step as the last peer checked, and all "failed"). In fp32
    on Hopper steps 9 and 10 and the dispatcher are also timed with their weights prepared once,
    and the preparing is timed on its own."""
    dtype = bench.DTYPES[dtype_name]
    chosen = list(steps.STEPS)
    kernels = {s.label: steps.load(s.number) for s in chosen}
    ceilings = {"bf16 matmul TFLOP/s": 700.0, "fp32 matmul TFLOP/s": 50.0, "tf32 matmul TFLOP/s": 350.0,
                "copy TB/s": 4.0}
    peers = ["eager", "cuBLAS concat"]
    results = sweep._measure_point("toy", TOY, dtype_name, dtype, chosen, kernels, peers, ["graph"], None,
                                   ceilings, 0.02, seed=1)
    # step 6 is for bf16, steps 9 and 10 for fp32: in the other dtype they run their fallbacks, and
    # the sweep says so; so does step 12, for up to 16 tokens, at the toy's 384
    inputs = make_inputs(TOY, dtype, "cuda")
    expected = {name: "ok" if kernel.takes_fast_path(*inputs) else "skipped" for name, kernel in kernels.items()}
    elsewhere = (9, 10, 12) if dtype_name == "bf16" else (6, 12)
    assert {name for name, status in expected.items() if status == "skipped"} <= {steps.get(n).label for n in elsewhere}
    prepared = [f"{name} prepared" for name, status in expected.items() if status == "ok" and kernels[name].prepares_weights]
    if dispatch.prepare(*inputs[1:], TOY.heads) is not None:
        prepared.append(dispatch.PREPARED_NAME)
    assert bool(prepared) == (dtype_name == "fp32" and torch.cuda.get_device_capability() == (9, 0))
    assert {r.name: r.status for r in results} == {**expected, **{name: "ok" for name in [*peers, dispatch.NAME, *prepared]}}
    assert {(r.shape, r.dtype, r.mode) for r in results} == {("toy", dtype_name, "graph")}
    assert len({r.median_us for r in results if r.status == "ok"}) > 1
    assert all((r.prepare_us is not None and r.prepare_us > 0) == (r.name in prepared) for r in results if r.status == "ok")


@pytest.mark.parametrize("number", [9, 10])
def test_weights_prepared_once_are_correct_leave_the_workspace_and_replay_in_graphs(number):
    """Steps 9 and 10 given their weights prepared (Kernel.prepare): correct on the whole shape
    matrix; each call's workspace no longer holds the transposed weights; a captured graph replays
    on new hidden states; weights edited in place after preparing are refused."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip(f"step {number}'s own kernel needs an sm_90 GPU; elsewhere nothing is prepared")
    kernel = steps.load(number)
    verdicts = check.check_matrix(steps.Prepared(kernel, kernel.prepare), "cuda")
    assert all(v.ok for v in verdicts), "\n".join(str(v) for v in verdicts if not v.ok)
    shape = Shape(1, 37, 264, 40, 3, 16)
    static = make_inputs(shape, torch.float32, "cuda", seed=1)
    prepared = kernel.prepare(*static[1:], shape.heads)
    out = torch.empty(shape.out_shape, device="cuda")
    problem = MlaProblem(*(t.data_ptr() for t in (*static, out)), shape.tokens, shape.d_model, shape.rank,
                         shape.heads, shape.head_dim, MLA_FLOAT32, None, None)
    workspace_bytes = ctypes.CFUNCTYPE(ctypes.c_size_t, ctypes.POINTER(MlaProblem))(kernel._workspace_address)
    each_call = workspace_bytes(ctypes.byref(problem))
    problem.prepared = prepared.data.data_ptr()
    assert each_call - workspace_bytes(ctypes.byref(problem)) == prepared.nbytes > 0
    kernel(*static, shape.heads, out=out, prepared=prepared)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernel(*static, shape.heads, out=out, prepared=prepared)
    for seed in (2, 3):  # new tokens, the same weights
        static.hidden.copy_(make_inputs(shape, torch.float32, "cuda", seed=seed).hidden)
        out.fill_(float("nan"))
        graph.replay()
        verdict = check.compare(out, oracle(static, shape.heads), torch.float32, shape, check.tolerance(kernel, torch.float32))
        assert verdict.ok, verdict
    static.w_up_k.copy_(make_inputs(shape, torch.float32, "cuda", seed=4).w_up_k)
    with pytest.raises(ValueError, match="w_up_k was changed in place after it was prepared; prepare again"):
        kernel(*static, shape.heads, prepared=prepared)


@pytest.mark.parametrize("tokens, dtype", [(3, torch.float32), (64, torch.float32), (300, torch.float32),
                                           (300, torch.bfloat16)])
def test_the_dispatcher_given_prepared_weights_is_correct(tokens, dtype):
    """mla_lab.prepare, then mla_lab.project(..., prepared=) at V2-Lite's widths: decode tokens run
    step 12 (which reads the weights as they are), more run step 10 on the prepared layout in fp32
    (from 33 tokens, where step 12 would otherwise take fp32 as one tile);
    in bf16 no step project runs has a layout of its own, so there is nothing to prepare."""
    shape = Shape(1, tokens, 2048, 512, 16, 128)
    inputs = make_inputs(shape, dtype, "cuda")
    on_hopper = torch.cuda.get_device_capability() == (9, 0)
    prepared = dispatch.prepare(*inputs[1:], shape.heads)
    assert (prepared is not None) == (dtype == torch.float32 and on_hopper)
    if prepared is not None:
        assert prepared.step.number == dispatch.PREPARED_STEP and prepared.nbytes > 0
        assert (dispatch.choose(*inputs[:4], prepared=True) == dispatch.PREPARED_STEP) == (tokens > 32)
    assert check.check(steps.Prepared(dispatch.project, dispatch.prepare), shape, dtype, "cuda", trials=2).ok


def writes_zeros(*inputs_and_heads, out=None):
    """A wrong kernel: zeros where the projection belongs."""
    return out.zero_()


writes_zeros.writes_into_out = True


def test_compare_refuses_to_time_a_wrong_kernel():
    """bench.compare checks each kernel's output (NaN-filled first) before timing it."""
    right = steps.load(4)
    with pytest.raises(AssertionError, match="zeros is wrong"):
        bench.compare({"right": right, "zeros": writes_zeros}, TOY, torch.bfloat16, with_peers=False)
    timings = bench.compare({"right": right}, TOY, torch.bfloat16)
    assert [t.name for t in timings] == ["right", "eager", "cuBLAS concat"] and all(t.median_us > 0 for t in timings)


def test_an_unchecked_measure_times_a_wrong_kernel_and_reports_no_error():
    """Unchecked (for probes cut short on purpose), a wrong kernel is timed, its error unmeasured."""
    results = bench.measure({"zeros": writes_zeros}, TOY, torch.bfloat16, (), rotate_inputs=True, checked=False)
    assert [(r.name, r.status, r.rel_error) for r in results] == [("zeros", "ok", None)] and results[0].median_us > 0


@pytest.mark.parametrize("rank", [520, 700, 12296])
def test_the_dispatcher_is_correct_at_latent_widths_past_the_tensor_core_tiles(rank):
    """mla_lab.project at ranks only the first steps take: step 4 to 640, step 2 to 12,288, step 1 beyond."""
    shape = Shape(1, 5, 64, rank, 2, 16)
    inputs = make_inputs(shape, torch.float32, "cuda")
    assert dispatch.choose(*inputs[:4]) == dispatch.widest_step(rank)
    assert check.check(dispatch.project, shape, torch.float32, "cuda", trials=1).ok
