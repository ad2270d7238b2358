"""Deployment specs the web and worker tests share."""

from __future__ import annotations

import copy
from typing import Any

DDTREE_SPEC: dict[str, Any] = {
    "name": "kimi-ddtree",
    "recipe": "kimi-k2.6-ddtree",
    "gpus": [0],
    "engine": {
        "model_path": "/models/Kimi-K2.6",
        "tp_size": 1,
        "trust_remote_code": True,
        "speculative_algorithm": "DDTREE",
        "speculative_draft_model_path": "/models/Kimi-K2.6-DFlash",
        "speculative_num_draft_tokens": 8,
        "speculative_ddtree_budget": 32,
        "attention_backend": "fa3",
        "disable_overlap_schedule": True,
    },
    "extra_args": [],
}


def spec(**changes: Any) -> dict[str, Any]:
    """A copy of the DDTree spec with top-level or `engine.<key>` changes."""
    data = copy.deepcopy(DDTREE_SPEC)
    for key, value in changes.items():
        if key.startswith("engine__"):
            data["engine"][key.removeprefix("engine__")] = value
        else:
            data[key] = value
    return data
