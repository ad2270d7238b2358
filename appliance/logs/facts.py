"""What a deployment runs with, for the causes that quote it: from the spec, and from the
engine's own `server_args=ServerArgs(...)` line.

The spec gives what the engine could not print before it failed (a drafter path that breaks
SGLang's argument parsing, before server_args is printed) and what it never prints (the
GPU list); the server_args line gives what SGLang resolved (a default tp_size, the CUDA-graph
batch limit). Where both say, the engine's own line wins: it is what ran.
"""

from __future__ import annotations

import re
from typing import Any

from appliance.engine.spec import DeploymentSpec

SERVER_ARGS_PREFIX = "server_args=ServerArgs("
# The keys read from the server_args line (433c58ed7 prints every field, `key=repr(value)`).
_SERVER_ARGS_KEYS = ("model_path", "speculative_draft_model_path", "tp_size", "pp_size",
                     "base_gpu_id", "gpu_id_step", "disable_cuda_graph",
                     "cuda_graph_max_bs_decode", "speculative_algorithm",
                     "speculative_num_draft_tokens", "speculative_ddtree_budget",
                     "max_running_requests", "attention_backend")
_VALUE = re.compile(r"(?:^|[(, ])(" + "|".join(_SERVER_ARGS_KEYS)
                    + r")=('(?:[^'\\]|\\.)*'|[^,()]+)")
# The decode graphs' batch limit as 433c58ed7 resolves it (cuda_graph_config=...decode=
# PhaseConfig(backend='full', max_bs=256, ...)).
_DECODE_MAX_BS = re.compile(r"decode=PhaseConfig\(backend='(\w+)', max_bs=(\d+)")


# 433c58ed7 logs this when set_device fails (distributed/bootstrap.py init_torch_distributed):
# "Context: device='cuda' ps.gpu_id=1 os.environ.get('CUDA_VISIBLE_DEVICES')=None
# ps.tp_rank=1 ps.tp_size=2".
DEVICE_CONTEXT_PREFIX = "Context: device="
_DEVICE_CONTEXT = re.compile(
    r"ps\.gpu_id=(\d+) os\.environ\.get\('CUDA_VISIBLE_DEVICES'\)=('[^']*'|None) "
    r"ps\.tp_rank=(\d+) ps\.tp_size=(\d+)")


def device_context_facts(message: str) -> dict[str, Any]:
    """The facts of the engine's line on a failed set_device: the device a rank asked for
    and the CUDA_VISIBLE_DEVICES the container's process had."""
    found = _DEVICE_CONTEXT.search(message)
    if found is None:
        return {}
    gpu_id, visible, tp_rank, tp_size = found.groups()
    return {"device_gpu_id": int(gpu_id), "container_cuda_visible_devices": _value(visible),
            "device_tp_rank": int(tp_rank), "tp_size": int(tp_size)}


def spec_facts(spec: DeploymentSpec) -> dict[str, Any]:
    """The facts a deployment's spec gives (the agent and `appliance diagnose --spec`)."""
    e = spec.engine
    facts: dict[str, Any] = {
        "gpus": list(spec.gpus), "tp_size": e.tp_size, "pp_size": e.pp_size,
        "model_path": e.model_path,
        "speculative_draft_model_path": e.speculative_draft_model_path,
        "disable_cuda_graph": e.disable_cuda_graph, "cuda_graph_max_bs": e.cuda_graph_max_bs,
        "speculative_algorithm": e.speculative_algorithm,
        "speculative_num_draft_tokens": e.speculative_num_draft_tokens,
        "max_running_requests": e.max_running_requests,
    }
    if "CUDA_VISIBLE_DEVICES" in spec.env:
        facts["cuda_visible_devices"] = spec.env["CUDA_VISIBLE_DEVICES"]
    return {k: v for k, v in facts.items() if v is not None}


def server_args_facts(message: str) -> dict[str, Any]:
    """The facts of an engine's `server_args=ServerArgs(...)` line."""
    facts: dict[str, Any] = {}
    for key, raw in _VALUE.findall(message):
        facts.setdefault(key, _value(raw.strip()))
    limit = _DECODE_MAX_BS.search(message)
    if limit:
        if limit.group(1) == "disabled":
            facts["disable_cuda_graph"] = True
        facts["cuda_graph_max_bs"] = int(limit.group(2))
    elif facts.get("cuda_graph_max_bs_decode") is not None:
        facts["cuda_graph_max_bs"] = facts["cuda_graph_max_bs_decode"]
    facts.pop("cuda_graph_max_bs_decode", None)
    return facts


def _value(raw: str) -> Any:
    if raw[:1] == "'":
        return raw[1:-1].replace("\\'", "'")
    if raw in ("True", "False"):
        return raw == "True"
    if raw == "None":
        return None
    try:
        return int(raw)
    except ValueError:
        pass
    try:
        return float(raw)
    except ValueError:
        return raw
