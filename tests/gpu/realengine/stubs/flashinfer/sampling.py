# STUB (real-engine rig): names imported by sglang/srt/layers/sampler.py; never called with --sampling-backend pytorch.
def _unavailable(*a, **k):
    raise RuntimeError("flashinfer is a probe stub here; use --sampling-backend pytorch")
min_p_sampling_from_probs = _unavailable
top_k_top_p_sampling_from_probs = _unavailable
top_k_renorm_probs = _unavailable
top_p_renorm_probs = _unavailable
