"""Tune's candidates: variants of a deployment's spec that differ only in how it speculates.

The defaults: no speculation (the baseline every other candidate is checked lossless
against, so it runs first), DFLASH at the drafter's block size (the spec's own
`speculative_num_draft_tokens` where it sets one, else none: SGLang reads it from the
drafter's config), and DDTREE at budgets 8, 16 and 32 on that block. An operator adds others
as engine-option changes (another block size, `cuda_graph_max_bs`).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field
from typing import Any

from appliance.engine.spec import engine_field_names

BASELINE = "none"
DDTREE_BUDGETS = (8, 16, 32)
MAX_CANDIDATES = 12
NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,39}")
# The options that say how an engine speculates: the baseline clears them all.
SPECULATIVE_FIELDS = ("speculative_draft_model_path", "speculative_num_draft_tokens",
                      "speculative_dflash_block_size", "speculative_ddtree_budget",
                      "speculative_num_steps", "speculative_eagle_topk",
                      "speculative_draft_attention_backend")
# Options a candidate may not change: they would make it another model, another service or
# other GPUs, not another way of speculating.
FIXED_FIELDS = ("model_path", "tokenizer_path", "served_model_name", "tp_size", "dp_size",
                "pp_size", "ep_size", "host", "port")


class CandidateError(ValueError):
    """A candidate the operator wrote that cannot be one; `field` names where."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(message)
        self.field = field_name


@dataclass(frozen=True)
class Candidate:
    name: str
    # engine options set on the deployment's spec (None: the option left out)
    engine: dict[str, Any] = field(default_factory=dict)

    @property
    def algorithm(self) -> str:
        return str(self.engine.get("speculative_algorithm") or "NONE").upper()

    @property
    def speculative(self) -> bool:
        return self.algorithm != "NONE"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "engine": dict(self.engine), "algorithm": self.algorithm}


def default_candidates(engine: dict[str, Any], *,
                       budgets: tuple[int, ...] = DDTREE_BUDGETS) -> list[Candidate]:
    """The baseline, DFLASH and DDTREE per budget, for a spec's engine options."""
    cleared: dict[str, Any] = {k: None for k in SPECULATIVE_FIELDS}
    found = [Candidate(BASELINE, {**cleared, "speculative_algorithm": "NONE"})]
    drafter = engine.get("speculative_draft_model_path")
    block = engine.get("speculative_num_draft_tokens") or engine.get(
        "speculative_dflash_block_size")
    chain = {**cleared, "speculative_draft_model_path": drafter,
             "speculative_num_draft_tokens": block}
    found.append(Candidate("dflash", {**chain, "speculative_algorithm": "DFLASH"}))
    keep = {k: engine[k] for k in ("speculative_draft_attention_backend",) if engine.get(k)}
    for budget in budgets:
        found.append(Candidate(f"ddtree-{budget}", {**chain, **keep,
                                                    "speculative_algorithm": "DDTREE",
                                                    "speculative_ddtree_budget": budget}))
    return found


def parse_candidates(raw: Any, engine: dict[str, Any], *, defaults: bool = True
                     ) -> list[Candidate]:
    """The defaults (unless `defaults` is false, then the baseline alone) and the operator's
    extra candidates: a list of {"name": ..., "engine": {option: value}}, each a change of
    the DFLASH candidate's options when it speculates, else of the baseline's."""
    base = default_candidates(engine)
    chosen = base if defaults else base[:1]
    if raw in (None, ""):
        return chosen
    if not isinstance(raw, list):
        raise CandidateError("candidates", 'a list of {"name": ..., "engine": {...}}')
    names = {c.name for c in chosen}
    known = set(engine_field_names())
    for i, item in enumerate(raw):
        where = f"candidates[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("engine"), dict):
            raise CandidateError(where, 'write {"name": "dflash-bs16", "engine": '
                                 '{"speculative_num_draft_tokens": 16}}')
        name = str(item.get("name") or "")
        if not NAME.fullmatch(name):
            raise CandidateError(f"{where}.name", "a short name of lowercase letters, digits, "
                                 "'.', '_' or '-', e.g. dflash-bs16")
        if name in names:
            raise CandidateError(f"{where}.name", f"{name!r} is taken; name each candidate once")
        options = item["engine"]
        unknown = sorted(set(options) - known)
        if unknown:
            raise CandidateError(f"{where}.engine", f"unknown engine options {unknown[:5]}; "
                                 "use SGLang option names, e.g. cuda_graph_max_bs")
        fixed = sorted(set(options) & set(FIXED_FIELDS))
        if fixed:
            raise CandidateError(f"{where}.engine", f"a candidate keeps {fixed}: Tune varies "
                                 "how the deployment speculates, not what it serves")
        algorithm = str(options.get("speculative_algorithm") or "DFLASH").upper()
        start = base[1] if algorithm != "NONE" else base[0]
        chosen.append(Candidate(name, {**start.engine, **options,
                                       "speculative_algorithm": algorithm}))
        names.add(name)
    if len(chosen) > MAX_CANDIDATES:
        raise CandidateError("candidates", f"{len(chosen)} candidates; at most "
                             f"{MAX_CANDIDATES}")
    return chosen


def candidate_spec(spec: dict[str, Any], candidate: Candidate) -> dict[str, Any]:
    """The deployment's spec as this candidate runs it: its engine options changed (None
    written out: left out, a recipe's default would come back in its place), everything else
    (name, GPUs, replicas, served name, keys' scope, env, secrets) the deployment's own."""
    data = copy.deepcopy(spec)
    data["engine"] = {**(data.get("engine") or {}), **candidate.engine}
    return data
