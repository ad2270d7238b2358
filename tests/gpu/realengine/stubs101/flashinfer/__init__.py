# STUB (real-engine rig): flashinfer is not installed. sglang/srt/layers/sampler.py imports
# flashinfer.sampling unconditionally on CUDA; with --sampling-backend pytorch and
# SGLANG_IS_FLASHINFER_AVAILABLE=false nothing here is ever called. Every other
# flashinfer submodule is absent, so guarded `from flashinfer.x import ...` still fails.
__version__ = "0.0.0+probe-stub"
