"""The self-check's data and its pure parts: the report, the graph roles, the stream lines.

No torch, no NVML. STREAM_PREFIX and parse_stream_line are the contract with the
worker's log parser (appliance.logs.parser).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

ALGORITHMS = ("NONE", "EAGLE3", "DFLASH", "DDTREE")
STREAM_PREFIX = "gpu-check: "


@dataclass
class Check:
    id: str
    ok: bool
    message: str
    fix: str = ""


@dataclass(frozen=True)
class GraphRole:
    role: str  # "target_verify", "draft" or "decode", as SGLang names its runners
    width: int  # tokens per request in the captured static buffer
    mask: str  # "tree", "causal" or "full": the attention mask the role uses


@dataclass
class Report:
    ok: bool = False
    elapsed_s: float = 0.0
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    torch_version: str | None = None
    gpus: list[dict[str, Any]] = field(default_factory=list)
    topology: dict[str, Any] = field(default_factory=dict)
    allreduce: dict[str, Any] = field(default_factory=dict)
    graphs: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    # Told (kind, payload) as the check goes: the --stream output. Not part of the report.
    listener: Callable[[str, dict[str, Any]], None] | None = field(
        default=None, repr=False, compare=False
    )

    def add(self, *checks: Check) -> None:
        for check in checks:
            self.checks.append(check)
            self.tell("check", asdict(check))

    def tell(self, kind: str, payload: dict[str, Any]) -> None:
        if self.listener is not None:
            self.listener(kind, payload)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("listener", None)
        return data


# --------------------------------------------------------------------------- pure parts


def graph_roles(
    algorithm: str = "NONE",
    block_size: int | None = None,
    budget: int | None = None,
    verify_width: int | None = None,
    draft_width: int | None = None,
) -> list[GraphRole]:
    """The CUDA-graph widths a deployment captures, as the DDTree fix defines them.

    DDTREE verifies budget+1 tokens per request with a tree mask while its DFlash
    drafter still runs at block size; DFLASH verifies its block with a causal
    mask; NONE decodes one token. Explicit widths override the derived ones.
    """
    algo = algorithm.upper()
    if algo not in ALGORITHMS:
        choices = ", ".join(ALGORITHMS)
        raise ValueError(f"unknown algorithm {algorithm!r}; expected one of {choices}")
    if algo == "NONE":
        return [GraphRole("decode", verify_width or 1, "causal")]
    if block_size is None and (verify_width is None or draft_width is None):
        raise ValueError(f"{algo} needs --block-size (or both --verify-width and --draft-width)")
    block = block_size if block_size is not None else int(draft_width or 0)
    if block < 1:
        raise ValueError("block size must be at least 1")
    if algo == "DDTREE":
        # PR #27509 defaults the budget to block-1 when unset.
        tree_budget = budget if budget is not None else block - 1
        if tree_budget < 1:
            raise ValueError("DDTREE budget must be at least 1")
        verify, mask = tree_budget + 1, "tree"
    else:
        verify, mask = block, "causal"
    return [
        GraphRole("target_verify", verify_width or verify, mask),
        # The DFlash drafter fills the whole block in one forward: it sees every slot.
        GraphRole("draft", draft_width or block, "full"),
    ]


def explicit_roles(verify_width: int, draft_width: int | None) -> list[GraphRole]:
    """Roles from widths alone (no algorithm): a tree verify plus an optional draft."""
    roles = [GraphRole("target_verify", verify_width, "tree" if verify_width > 1 else "causal")]
    if draft_width:
        roles.append(GraphRole("draft", draft_width, "full"))
    return roles


def capture_batch_sizes(max_bs: int) -> list[int]:
    """Powers of two up to max_bs, plus max_bs itself, like SGLang's capture list."""
    if max_bs < 1:
        raise ValueError("max batch size must be at least 1")
    sizes = [1 << i for i in range(max_bs.bit_length()) if (1 << i) <= max_bs]
    if sizes[-1] != max_bs:
        sizes.append(max_bs)
    return sizes


def summarize(checks: Sequence[Check]) -> bool:
    return all(c.ok for c in checks)


# --------------------------------------------------------------------------- stream lines


def stream_line(kind: str, payload: Mapping[str, Any]) -> str:
    """One --stream line; appliance.logs.parser reads it back (parse_stream_line)."""
    return STREAM_PREFIX + json.dumps({"event": kind, **payload}, separators=(",", ":"))


def parse_stream_line(text: str) -> dict[str, Any] | None:
    """The event of a --stream line, or None when the line is not one."""
    if not text.startswith(STREAM_PREFIX + "{"):
        return None
    try:
        data = json.loads(text[len(STREAM_PREFIX):])
    except ValueError:
        return None
    return data if isinstance(data, dict) and isinstance(data.get("event"), str) else None
