# STUB (real-engine rig): names imported by sglang/srt/layers/sampler.py; never called with --sampling-backend pytorch.
# The two renorm functions are called anyway by sglang 0.5.23's DFLASH worker (its sampling
# prewarm resolves sglang.kernels.ops.sampling.renorm to flashinfer on CUDA, whatever the sampling
# backend): they run sglang's own Triton kernels for them (what 0.5.23 uses on ROCm).
def _unavailable(*a, **k):
    raise RuntimeError("flashinfer is a probe stub here; use --sampling-backend pytorch")


def _renorm_triton(name):
    def call(probs, threshold, *a, **k):
        try:
            from sglang.kernels.ops.sampling import renorm_triton
        except ImportError:
            return _unavailable()
        return getattr(renorm_triton, name)(probs, threshold)
    return call


min_p_sampling_from_probs = _unavailable
top_k_top_p_sampling_from_probs = _unavailable
top_k_renorm_probs = _renorm_triton("top_k_renorm_probs_triton")
top_p_renorm_probs = _renorm_triton("top_p_renorm_probs_triton")
