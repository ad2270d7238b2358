# STUB (real-engine rig): name imported by sglang/srt/layers/attention/vision.py on CUDA (vision encoders only).
def cudnn_batch_prefill_with_kv_cache(*a, **k):
    raise RuntimeError("flashinfer is a probe stub here")
