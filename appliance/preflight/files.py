"""File rules: the model folders and secrets a spec names exist before anything starts.

What the file system shows is gathered by the caller (the web side reads only under the
model roots, web/deployments/services/modelfiles.py) and passed in as plain data, so the
rules stay pure: ModelFolder per model path field, the names in the secret store.
"""

from __future__ import annotations

import difflib

from appliance.preflight.types import WAITING_STATES, Context, Finding, ModelFolder, findings

# Where engines see the models folder (compose mounts APPLIANCE_MODELS_DIR there, read-only).
MODELS_MOUNT = "/models"
# Where compose takes engine secrets from on the host (APPLIANCE_ENGINE_SECRETS_HOST_DIR).
SECRETS_HOST_DIR = "./engine-secrets"
MODEL_FIELDS = ("engine.model_path", "engine.speculative_draft_model_path")
WEIGHT_SUFFIXES = (".safetensors", ".bin")
GB = 1000**3


def _what(fld: str) -> str:
    return "the drafter" if fld.endswith("draft_model_path") else "the model"


def _folder_finding(fld: str, folder: ModelFolder) -> list[Finding]:
    if not folder.mounted:
        return findings("model-path-outside-models", "error", fld,
                        f"{folder.path!r} is outside {MODELS_MOUNT}: engines see only the "
                        f"models folder, mounted at {MODELS_MOUNT}",
                        f"put {_what(fld)} in the models folder on the host "
                        f"(APPLIANCE_MODELS_DIR) and write {MODELS_MOUNT}/<folder>")
    if folder.escapes:
        return findings("model-path-outside-models", "error", fld,
                        f"{folder.path!r} resolves outside {MODELS_MOUNT}: a symlink leads out "
                        "of the models folder, so the engine would read another folder",
                        f"put {_what(fld)} itself in the models folder on the host "
                        f"(APPLIANCE_MODELS_DIR), not a link to it, and write "
                        f"{MODELS_MOUNT}/<folder>")
    if not folder.exists:
        name = folder.path.rstrip("/").rsplit("/", 1)[-1]
        near = difflib.get_close_matches(name, folder.siblings, n=3, cutoff=0.6)
        hint = f"did you mean {', '.join(f'{MODELS_MOUNT}/{n}' for n in near)}? " if near else ""
        return findings("model-path-missing", "error", fld,
                        f"no folder {folder.path!r} in the models folder",
                        f"{hint}fix the path, or copy {_what(fld)} into the models folder on "
                        "the host (APPLIANCE_MODELS_DIR)")
    if not folder.has_config:
        return findings("model-config-missing", "error", fld,
                        f"{folder.path!r} has no config.json: it is not a checkpoint folder "
                        "(or its download did not finish)",
                        "point the path at the folder that holds config.json, or finish the "
                        "download")
    if not folder.weight_files:
        return findings("model-weights-missing", "error", fld,
                        f"{folder.path!r} has no weight files (*.safetensors or *.bin)",
                        "download the weights into that folder, or point the path at the "
                        "folder that holds them")
    return findings("model-files", "info", fld,
                    f"{folder.path}: config.json and {folder.weight_files} weight files, "
                    f"{folder.weights_bytes / GB:.2f} GB", "nothing to do")


def rule_model_files(ctx: Context) -> list[Finding]:
    """Each model path names a checkpoint folder the engine will see (quiet when not told)."""
    found: list[Finding] = []
    for fld, folder in (ctx.model_folders or {}).items():
        store = (ctx.store_models or {}).get(fld)
        if store is not None and store.state in WAITING_STATES and folder.mounted:
            continue  # still downloading: files are missing yet (model-downloading says so)
        found += _folder_finding(fld, folder)
    return found


def rule_secret_in_store(ctx: Context) -> list[Finding]:
    """Each declared secret is in the engine secret store (quiet when the store is unknown)."""
    if ctx.secret_names is None:
        return []
    missing = [name for name in ctx.spec.secrets if name not in ctx.secret_names]
    return [Finding("secret-missing", "error", "secrets",
                    f"secret {name} is not in the engine secret store, so the engine would "
                    "fail at its start",
                    f"put its value in the file {SECRETS_HOST_DIR}/{name} on the host "
                    "(APPLIANCE_ENGINE_SECRETS_HOST_DIR; one file per name, chmod 600) or set "
                    f"APPLIANCE_ENGINE_SECRET_{name} in the agent's environment; or remove "
                    f"{name} from secrets")
            for name in missing]
