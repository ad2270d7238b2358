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

A candidate token outside the baseline's top two is judged by its own log-prob in the
baseline's distribution, so the check asks for more than two (TOP_LOGPROBS): DFLASH on fa3
against the triton baseline (tests/fixtures/real-engine/433c58ed7/dflash_fa3) parted once at
a token outside the top two with those two a single bf16 step apart (0.0625); with only two
log-probs that cannot be told from a real failure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

NEAR_TIE_GAP = 0.5
TOP_LOGPROBS = 5  # the baseline's top log-probs the check asks for at each position


@dataclass(frozen=True)
class Divergence:
    position: int | None  # the first output token that differs; None when identical
    gap: float | None  # the baseline's top-1 minus top-2 log-prob at that position
    candidate_in_top2: bool | None
    # "identical" | "near-tie" | "failure" | "unknown" (no log-probs there) | "not-greedy"
    # (the baseline's own token there is not its top-1: it cannot judge)
    verdict: str
    # The baseline's top-1 minus the candidate token's own log-prob there, where the
    # candidate is among the top log-probs given (None when it is not, or identical).
    candidate_gap: float | None = None
    # The baseline's top-1 minus its own token's log-prob there (0 for a greedy baseline;
    # None where its token is outside the top log-probs given).
    baseline_gap: float | None = None


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
    top = baseline_top[position]
    first, second = top[0], top[1]
    gap = float(first[0]) - float(second[0])
    candidate = candidate_ids[position] if position < len(candidate_ids) else None
    in_top2 = candidate is not None and candidate in (first[1], second[1])
    own = next((float(first[0]) - float(entry[0]) for entry in top if entry[1] == candidate), None)
    if position < len(baseline_ids):
        mine = baseline_ids[position]
        b_own = next((float(first[0]) - float(e[0]) for e in top if e[1] == mine), None)
        if b_own is None or b_own > 0:  # an exact tie with the top-1 is still greedy
            return Divergence(position, gap, in_top2, "not-greedy", own, b_own)
    # Outside every log-prob given: a near-tie only where all of them are tied exactly (the
    # recordings show three-way ties in bf16); else it sits at least the last one's gap down.
    tie = own <= threshold if own is not None else float(first[0]) == float(top[-1][0])
    return Divergence(position, gap, in_top2, "near-tie" if tie else "failure", own)
