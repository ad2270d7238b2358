# STUB (real-engine rig): the CUTLASS DSL (nvidia-cutlass-dsl 4.8.0) does not fit a device call's
# carry (its one native library, _cutlass_ir, is 193 MB, 50 MB xz'd). sglang 0.5.23 imports it
# wherever a bf16 Qwen2/Qwen3/Llama MLP is built (layers/dual_gemm.py), but runs its kernel only
# on SM100 (can_use_dual_gemm), never on the rig's Hopper GPU. Every name resolves, so the
# importing module loads; a decorated function and any other call raise, so a run that does
# reach the DSL stops there and says so.
from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn


def _refuse(name: str) -> NoReturn:
    raise RuntimeError(f"{name}: the CUTLASS DSL is a rig stub here (nvidia-cutlass-dsl is not "
                       "carried); this run needs the real package")


class Absent:
    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Absent(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # A decorator at import time (`@cute.experimental.jit`): the function stays, and raises.
        if len(args) == 1 and not kwargs and callable(args[0]) and not isinstance(args[0], Absent):
            function = args[0]
            name = f"{self._name}({getattr(function, '__qualname__', function)})"

            def refused(*_args: Any, **_kwargs: Any) -> NoReturn:
                _refuse(name)
            refused.__wrapped__ = function  # type: ignore[attr-defined]
            return refused
        _refuse(self._name)

    def __repr__(self) -> str:
        return f"<rig stub {self._name}>"


def module_getattr(module: str) -> Callable[[str], Absent]:
    """A module's __getattr__: any name but a dunder is an Absent."""
    def getattr_(attr: str) -> Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return Absent(f"{module}.{attr}")
    return getattr_
