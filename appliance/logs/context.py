"""What the log has said so far: the state the parser keeps and diagnoses read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ParseContext:
    """What the log has said so far; diagnoses need it (widths, batch sizes, phase)."""

    phase: str = "starting"
    speculative: bool = False
    verify_width: int | None = None
    draft_width: int | None = None
    capture_bs: list[int] | None = None
    last_bs: int | None = None
    max_running_req: int = 0
    selfcheck_reported: bool = False
    # Tokens per request each role's graph must be captured for (appliance.engine.widths),
    # when the deployment's spec is known; a capture line that disagrees is a finding.
    needed_widths: dict[str, int] | None = None
    # Per rank (its log prefix): how many weight loads began and ended and KV pools were
    # allocated. SGLang loads and allocates for the target first, then for the drafter.
    loads_begun: dict[tuple[tuple[str, int], ...], int] = field(default_factory=dict)
    loads_ended: dict[tuple[tuple[str, int], ...], int] = field(default_factory=dict)
    kv_pools: dict[tuple[tuple[str, int], ...], int] = field(default_factory=dict)
    # What the deployment runs with (appliance.logs.facts): the spec's values where the
    # caller knows the spec, then what the engine's own `server_args=` line says. Causes
    # quote them (the drafter's path, the GPU list, tp_size) and tell roles apart by them.
    facts: dict[str, Any] = field(default_factory=dict)
    # The ranks of the traceback being matched (its log prefix: {"tp": 1}).
    error_ranks: dict[str, int] = field(default_factory=dict)
