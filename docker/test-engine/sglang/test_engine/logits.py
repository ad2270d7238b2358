"""The simulated target model behind /generate: at temperature 0 its tokens and top-2
log-probs at each position are a fixed function of the prompt, so a speculative and a
baseline test engine of the same model give the same tokens, as the real ones promise.

The model has a near-tie (top two within one bf16 step, 0.0625, as the real engine's
divergences were: tests/fixtures/real-engine) at every token p with p % 8 == 4 (4, 12,
20, ...); everywhere else its top two are at least 1.5 apart. `TEST_ENGINE_DIVERGE` plants
divergences in this engine's output: a comma-separated list of `KIND:TOKEN[@TEXT]`, KIND
`margin` (at a token with a clear margin) or `near-tie` (at one of the near-ties), TOKEN
the 0-based output position, TEXT a piece of the prompts it applies to (default: every
prompt; the first entry that applies wins). There the engine takes the model's second
choice, and from there on it continues from that other token, as a real one would.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

VOCAB = ("the", "draft", "tree", "verifies", "tokens", "in", "one", "forward", "pass", "and",
         "accepts", "a", "longer", "prefix", "so", "decoding", "runs", "faster", "target",
         "model", "block", "of", "eight", "budget", "width", "kernel", "graph", "batch",
         "step", "cache", "page", "mask")
NEAR_TIE_EVERY, NEAR_TIE_AT = 8, 4
NEAR_TIE_GAP = 0.0625  # one bf16 step of logits of this magnitude
KINDS = ("margin", "near-tie")


class DivergeError(ValueError):
    """TEST_ENGINE_DIVERGE cannot be used; the engine says why at launch and exits."""


@dataclass(frozen=True)
class Planted:
    kind: str
    token: int
    text: str  # the prompts it applies to contain this ("": every prompt)

    def applies(self, prompt: str) -> bool:
        return self.text in prompt


TOP_K = 8  # the most log-probs per position the model gives (top_logprobs_num beyond: these)


@dataclass(frozen=True)
class Step:
    """One output position: the model's top TOP_K (id, log-prob), best first, and the token
    given."""

    top: tuple[tuple[int, float], ...]
    token: int


def is_near_tie(position: int) -> bool:
    return position % NEAR_TIE_EVERY == NEAR_TIE_AT


def _entry(item: str) -> Planted:
    head, _, text = item.partition("@")
    kind, _, token = head.partition(":")
    kind = kind.strip()
    if kind not in KINDS or not token.strip().isdigit():
        raise DivergeError(f"TEST_ENGINE_DIVERGE: {item!r} is not KIND:TOKEN[@TEXT] with KIND "
                           f"one of {', '.join(KINDS)}, e.g. margin:5 or near-tie:12@fox")
    position = int(token)
    if (kind == "near-tie") != is_near_tie(position):
        where = "is not" if kind == "near-tie" else "is"
        raise DivergeError(f"TEST_ENGINE_DIVERGE: {item!r}: token {position} {where} one of the "
                           f"model's near-ties (tokens p with p % {NEAR_TIE_EVERY} == "
                           f"{NEAR_TIE_AT}: 4, 12, 20, ...)")
    return Planted(kind, position, text)


def parse_diverge(value: str) -> tuple[Planted, ...]:
    return tuple(_entry(item) for item in value.split(",") if item.strip())


def _digest(seed: str, position: int) -> bytes:
    return hashlib.sha256(f"{seed}\0{position}".encode()).digest()


def model_step(seed: str, position: int) -> tuple[tuple[int, float], ...]:
    """The model's top TOP_K at `position` after the context `seed` stands for: the top
    two `gap` apart, each further one 0.75 below the one before."""
    h = _digest(seed, position)
    first = h[0] % len(VOCAB)
    second = (first + 1 + h[1] % (len(VOCAB) - 1)) % len(VOCAB)
    top1 = -(0.015625 + (h[2] % 48) / 64)  # a multiple of 1/64: exact in bf16 and float
    gap = NEAR_TIE_GAP if is_near_tie(position) else 1.5 + (h[3] % 40) / 16
    rest = [t for t in (second + k for k in range(1, len(VOCAB))) if t % len(VOCAB) != first]
    ids = [first, second, *(t % len(VOCAB) for t in rest[:TOP_K - 2])]
    return tuple((t, top1 - (gap if i else 0.0) - 0.75 * max(i - 1, 0))
                 for i, t in enumerate(ids))


def planted_for(prompt: str, planted: tuple[Planted, ...]) -> Planted | None:
    return next((p for p in planted if p.applies(prompt)), None)


def steps(prompt: str, count: int, planted: tuple[Planted, ...] = ()) -> list[Step]:
    """`count` output positions for `prompt`: the model's greedy tokens, except at this
    engine's planted divergence, after which the context (so every later step) differs."""
    diverge = planted_for(prompt, planted)
    seed, out = prompt, []
    for position in range(count):
        top = model_step(seed, position)
        token = top[0][0]
        if diverge is not None and position == diverge.token:
            token = top[1][0]
            seed = f"{prompt}\0took {token} at {position}"
        out.append(Step(top, token))
    return out


def token_text(token: int) -> str:
    return " " + VOCAB[token]
