"""`bench --compare`: whether a difference from the stored run is the GPU or the kernel (mla_lab.compare)."""


def test_your_run_beside_the_stored_one_tells_the_gpu_from_the_kernel():
    from mla_lab.compare import verdict

    # a slower GPU: every time 1.5x longer, cuBLAS's too
    slower_gpu = verdict(yours_us=9.0, your_peer_us=12.0, stored_us=6.0, stored_peer_us=8.0)
    assert slower_gpu.startswith("the kernel is the stored one's equal") and "0.67x the stored speed" in slower_gpu
    # the same GPU, a kernel half as fast as the stored one
    slower_kernel = verdict(yours_us=12.0, your_peer_us=8.0, stored_us=6.0, stored_peer_us=8.0)
    assert slower_kernel.startswith("the kernel: 50% slower")
    assert verdict(5.0, 5.0, None, None) == "nothing stored to compare with"
    # the stored kernel itself, 16 % off against cuBLAS (as a latency-bound step measured on an H100):
    # the code is the same, so the verdict cannot blame it
    same_code = verdict(yours_us=4090.0, your_peer_us=58.0, stored_us=4714.0, stored_peer_us=57.5, same_source=True)
    assert same_code.startswith("the stored kernel itself (same source), 16% faster") and "not the code" in same_code
