"""Where a speculative output parts from its baseline, and whether that is a real failure.

At temperature 0 speculation promises the target's own tokens, but bf16 kernels are not
batch-invariant: the same prompt gives other text sequentially and in a batch even without
speculation. So two outputs are compared at the first token where they part, by the
baseline's top-2 log-prob gap there (SGLang's `return_logprob` with `top_logprobs_num=2`):
a divergence at a near-tie is noise, one at a clear margin is a verify that changed the
output. On the real engine (tests/fixtures/real-engine, DDTREE and DFLASH against no
speculation, 12 prompts of 64 tokens) every divergence sat at a gap of 0.125 or less: one or
two bf16 steps of the logits (0.0625 at their magnitude) or an exact tie. The default
threshold, 0.5, is four times the largest gap measured there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NEAR_TIE_GAP = 0.5


@dataclass(frozen=True)
class Divergence:
    position: int | None  # the first output token that differs; None when identical
    gap: float | None  # the baseline's top-1 minus top-2 log-prob at that position
    candidate_in_top2: bool | None
    verdict: str  # "identical" | "near-tie" | "failure" | "unknown" (no log-probs there)


def first_divergence(baseline_ids: Sequence[int], baseline_top: Sequence[Sequence[Any]],
                     candidate_ids: Sequence[int], *,
                     threshold: float = NEAR_TIE_GAP) -> Divergence:
    """baseline_top: SGLang's output_top_logprobs, per position [[logprob, id, text], ...]."""
    pairs = zip(baseline_ids, candidate_ids, strict=False)
    position = next((i for i, (a, b) in enumerate(pairs) if a != b), None)
    if position is None:
        if len(baseline_ids) == len(candidate_ids):
            return Divergence(None, None, None, "identical")
        position = min(len(baseline_ids), len(candidate_ids))
    if position >= len(baseline_top) or len(baseline_top[position]) < 2:
        return Divergence(position, None, None, "unknown")
    first, second = baseline_top[position][0], baseline_top[position][1]
    gap = float(first[0]) - float(second[0])
    in_top2 = position < len(candidate_ids) and candidate_ids[position] in (first[1], second[1])
    # A token outside the top two is a near-tie only where the top two are tied exactly (a
    # third token tied with them: the recordings show such three-way ties in bf16).
    tie = gap <= threshold and (in_top2 or gap == 0.0)
    return Divergence(position, gap, in_top2, "near-tie" if tie else "failure")
