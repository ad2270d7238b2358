"""Compile SGLang's JIT kernels for the INT4 (compressed-tensors, Marlin) MoE path ahead.

    PYTHONPATH=<site>:<stubs>:<sglang src>/python python3 tests/gpu/realengine/jit_warm.py

The INT4 target's routed experts run Marlin kernels that SGLang builds at first use (tvm-ffi
and nvcc, cached in ~/.cache/tvm-ffi). real-engine.sh runs this in the background during the
round's first wave, so the INT4 engines load the cached modules instead of each waiting for
the build; it prints each module's build time, which is what a first INT4 start on a fresh
host spends compiling before it can serve.
"""

from __future__ import annotations

import time
import traceback

import torch


def main() -> None:
    from sglang.jit_kernel.gptq_marlin_repack import _jit_gptq_marlin_repack_module
    from sglang.jit_kernel.moe_wna16_marlin import _jit_moe_wna16_marlin_module

    failed = False
    for name, build in (("gptq_marlin_repack", _jit_gptq_marlin_repack_module),
                        ("moe_wna16_marlin bf16", lambda: _jit_moe_wna16_marlin_module(torch.bfloat16))):
        began = time.time()
        try:
            build()
            print(f"jit {name}: built in {time.time() - began:.1f} s", flush=True)
        except Exception:  # the build's own error is the finding: print it whole
            print(f"jit {name}: failed after {time.time() - began:.1f} s", flush=True)
            traceback.print_exc()
            failed = True
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
