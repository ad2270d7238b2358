"""Which environment variables a spec may set on its engine: an allowlist of the engine's
own families, plus the names the recipe declares (`env_allow:`). The deny list in
appliance.engine.bounds (loader, shell and interpreter variables) applies before this and
wins over both: a recipe cannot allow LD_PRELOAD.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from appliance.engine.errors import FieldError

# The variables SGLang, NCCL, CUDA, PyTorch, Triton, FlashInfer and the Hugging Face
# libraries read to tune themselves.
ALLOWED_PREFIXES = ("SGLANG_", "NCCL_", "CUDA_", "TORCH_", "PYTORCH_", "TRITON_",
                    "FLASHINFER_", "HF_HUB_", "TRANSFORMERS_")
ALLOWED_NAMES = frozenset({"TOKENIZERS_PARALLELISM", "OMP_NUM_THREADS"})
# The test engine's knobs: only where the setting APPLIANCE_ENGINE_TEST_ENV allows them.
TEST_ENGINE_PREFIX = "TEST_ENGINE_"


def env_key_allowed(key: str, *, declared: Iterable[str] = (), test_engine: bool = False) -> bool:
    return (key.startswith(ALLOWED_PREFIXES) or key in ALLOWED_NAMES or key in set(declared)
            or (test_engine and key.startswith(TEST_ENGINE_PREFIX)))


def env_key_errors(env: Mapping[str, str], *, declared: Iterable[str] = (),
                   test_engine: bool = False) -> list[FieldError]:
    """One error per key outside the allowlist, naming it and the ways to allow it."""
    names = list(declared)
    families = ", ".join(f"{p}*" for p in ALLOWED_PREFIXES)
    return [FieldError(f"env.{key}", f"{key} is not an engine variable the appliance passes "
                       f"(allowed: {families}, {', '.join(sorted(ALLOWED_NAMES))}, and the "
                       "names the recipe lists under env_allow)",
                       f"remove {key} from env, or add it to the recipe's env_allow: list")
            for key in env
            if not env_key_allowed(key, declared=names, test_engine=test_engine)]
