"""Model store rules: a model or drafter the store has not verified, and its load time.

What the store says of each model path field is gathered by the web side (the entry's
state and size, its root's measured read rate) and passed in as StoreModel, so the rules
stay pure. The drafter-against-target and block-size checks are not repeated here: they
run in parallelism and speculative, fed from the entry's config summary when the folder
has no config.json yet (config_from_summary).
"""

from __future__ import annotations

from typing import Any

from appliance.preflight.types import UNUSABLE_STATES, WAITING_STATES, Context, Finding, StoreModel
from appliance.store.loadtime import describe_load

GB = 1e9


def _what(fld: str) -> str:
    return "the drafter" if fld.endswith("draft_model_path") else "the model"


def _share(model: StoreModel) -> str:
    if not model.size_bytes:
        return ""
    return (f" ({100 * model.bytes_done / model.size_bytes:.0f} %, "
            f"{model.bytes_done / GB:.2f} of {model.size_bytes / GB:.2f} GB)")


def _state_finding(fld: str, model: StoreModel) -> list[Finding]:
    if model.entry_id is None:
        # Informational: the deployment needs nothing changed (a scan of the roots, which
        # every worker start runs, lists the folder and checks it).
        return [Finding("model-unverified", "info", fld,
                        f"{model.path} is not in the model store: its files were never "
                        "checked against a size or checksum (Scan the roots on the store "
                        "page lists and checks it)", "nothing to do")]
    if model.state in WAITING_STATES:
        return [Finding("model-downloading", "info", fld,
                        f"{model.path} is still {model.state}{_share(model)}: the deployment "
                        "waits and starts the engine once the download is verified",
                        "nothing to do; follow the download on the store page")]
    if model.state in UNUSABLE_STATES:
        why = f": {model.error}" if model.error else ""
        return [Finding("model-not-ready", "error", fld,
                        f"{_what(fld)} {model.path} is {model.state} in the model store{why}; "
                        "a partial or failed model is never mounted into an engine",
                        "resume or repeat the download on the store page, or pick a ready "
                        "model")]
    return []


def rule_model_store_state(ctx: Context) -> list[Finding]:
    """Each model path the store knows is verified, still downloading (wait), or refused."""
    found: list[Finding] = []
    for fld, model in (ctx.store_models or {}).items():
        found += _state_finding(fld, model)
    return found


def _bytes(ctx: Context, fld: str, model: StoreModel) -> int | None:
    on_disk = ctx.weights_bytes if fld == "engine.model_path" else ctx.drafter_weights_bytes
    folder = (ctx.model_folders or {}).get(fld)
    return model.size_bytes or (folder.weights_bytes if folder else 0) or on_disk


def rule_load_time(ctx: Context) -> list[Finding]:
    """The expected weight load of each model, from its size and its root's read rate."""
    found: list[Finding] = []
    for fld, model in (ctx.store_models or {}).items():
        size = _bytes(ctx, fld, model)
        if not size:
            continue
        load = describe_load(weights_bytes=size, rate_gbps=model.read_gbps)
        if model.read_gbps:
            found.append(Finding("load-time", "info", fld, f"{_what(fld)}: {load} (the root's "
                                 "measured sequential read rate)", "nothing to do"))
        else:
            found.append(Finding("load-time", "info", fld, f"{_what(fld)}: {load} (Measure "
                                 "on the store page gives the root's rate)", "nothing to do"))
    return found


def waits_for_download(ctx: Context, fld: str) -> bool:
    """The store is still fetching this field's model: its folder may lack files yet."""
    model = (ctx.store_models or {}).get(fld)
    return model is not None and model.state in WAITING_STATES


def config_from_summary(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """A config the rules read, from the store's summary (appliance.store.config)."""
    if not summary:
        return None
    keys = ("model_type", "num_hidden_layers", "hidden_size", "vocab_size",
            "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
            "architectures")
    config: dict[str, Any] = {k: summary[k] for k in keys if summary.get(k) is not None}
    if summary.get("experts") is not None:
        config["n_routed_experts"] = summary["experts"]
    mla = summary.get("mla")
    if isinstance(mla, dict):
        config.update(mla)
    drafter = summary.get("drafter")
    if isinstance(drafter, dict):
        config["dflash_config"] = {k: v for k, v in drafter.items() if v is not None}
    return config or None
