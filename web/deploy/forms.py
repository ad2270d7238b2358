"""The new-deployment form: flat fields a person fills in, turned into the shared spec."""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from typing import Any

import yaml
from django import forms
from django.conf import settings

from appliance.engine.spec import MAX_REPLICAS
from web.deployments.services import recipe_load, recipe_names
from web.deployments.spec_yaml import spec_yaml_load
from web.store.loadtime import store_model_options

ALGORITHMS = [("NONE", "None (autoregressive)"), ("DFLASH", "DFlash"), ("DDTREE", "DDTree")]

# Spec field path -> form field, so the service's errors land beside the right input.
FIELD_OF_SPEC = {
    "name": "name",
    "recipe": "recipe",
    "gpus": "gpu_ids",
    "extra_args": "extra_args",
    "engine.served_model_name": "extra_args",  # the form sets it as --served-model-name
    "engine.model_path": "model_path",
    "model_entry": "model_entry",
    "drafter_entry": "drafter_entry",
    "engine.speculative_draft_model_path": "drafter_path",
    "engine.speculative_algorithm": "algorithm",
    "engine.speculative_num_draft_tokens": "block_size",
    "engine.speculative_dflash_block_size": "block_size",
    "engine.speculative_ddtree_budget": "tree_budget",
    "engine.tp_size": "tp_size",
    "engine.attention_backend": "attention_backend",
    "self_check": "self_check",
    "confirm_warnings": "confirm_warnings",
    "env": "more_spec",
    "secrets": "more_spec",
    "shm_size": "more_spec",
    "restart": "more_spec",
    "replicas": "replicas",
    "host": "host",
    "companion": "companion",
}
# Spec keys the form has no input of its own for: they are written in More spec keys.
MORE_SPEC_KEYS = ("env", "secrets", "shm_size", "restart")
# Spec keys with an input of their own that a person might still write in More spec keys.
_OWN_FIELD_KEYS = {"replicas": "Replicas", "host": "Host", "companion": "Companion"}


def _recipe_choices() -> list[tuple[str, str]]:
    return [(name, name) for name in recipe_names()]


def _store_choices(kind: str) -> list[tuple[str, str]]:
    """The store's entries of one kind, each labelled with its state and expected load."""
    none = "(none: give the path below)"
    return [("", none)] + [(str(o["id"]), f"{o['path']} ({o['state']}): {o['estimate']}")
                           for o in store_model_options() if o["kind"] == kind]


def recipe_initial(engine_defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The form values a recipe decides, from its engine_defaults.

    Blank where the recipe sets nothing: a block size or tree budget left over from another
    recipe would contradict this one's algorithm. The recipe's other defaults (parsers,
    disable_overlap_schedule, ...) need no field: the server applies them under the spec.
    """
    initial: dict[str, Any] = {
        "algorithm": str(engine_defaults.get("speculative_algorithm") or "NONE").upper(),
        "block_size": engine_defaults.get("speculative_num_draft_tokens")
        or engine_defaults.get("speculative_dflash_block_size"),
        "tree_budget": engine_defaults.get("speculative_ddtree_budget"),
        "attention_backend": engine_defaults.get("attention_backend") or "",
    }
    # The GPUs are the site's, not the recipe's: keep the form's unless the recipe says.
    if engine_defaults.get("tp_size"):
        initial["tp_size"] = engine_defaults["tp_size"]
    return initial


def recipe_defaults() -> dict[str, dict[str, Any]]:
    """recipe_initial of every recipe that loads, by name (the page's script reads it too)."""
    defaults: dict[str, dict[str, Any]] = {}
    for name in recipe_names():
        try:
            defaults[name] = recipe_initial(recipe_load(name).engine_defaults)
        except ValueError:
            continue  # a broken site recipe: choosing it fills nothing, deploying says why
    return defaults


class DeploymentForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="Letters, digits and hyphens.")
    recipe = forms.ChoiceField(choices=_recipe_choices)
    model_entry = forms.ChoiceField(
        required=False, label="Model from the store",
        choices=lambda: _store_choices("target"),
        help_text="A model the store lists, with its expected weight-load time; or give its "
                  "path below.")
    model_path = forms.CharField(max_length=500, required=False,
                                 help_text="Path of the target model's weights.")
    drafter_entry = forms.ChoiceField(
        required=False, label="Drafter from the store",
        choices=lambda: _store_choices("drafter"),
        help_text="A DFlash drafter the store lists; or give its path below.")
    drafter_path = forms.CharField(max_length=500, required=False,
                                   help_text="Path of the DFlash drafter (DFlash and DDTree).")
    # These four follow the chosen recipe (recipe_initial), so they have no fixed initial.
    algorithm = forms.ChoiceField(choices=ALGORITHMS)
    block_size = forms.IntegerField(min_value=1, max_value=64, required=False)
    tree_budget = forms.IntegerField(min_value=1, max_value=512, required=False)
    tp_size = forms.IntegerField(min_value=1, max_value=64, initial=8, label="TP size")
    gpu_ids = forms.CharField(max_length=200, required=False, initial="0,1,2,3,4,5,6,7",
                              label="GPU ids", help_text="Comma-separated, e.g. 0,1,2,3.")
    attention_backend = forms.CharField(max_length=40, required=False)
    extra_args = forms.CharField(max_length=2000, required=False,
                                 label="Extra engine arguments",
                                 help_text="Further SGLang flags, e.g. --mem-fraction-static 0.85")
    replicas = forms.IntegerField(
        min_value=1, max_value=MAX_REPLICAS, initial=1, required=False,
        help_text="Engines of this spec behind its one name, each on its own GPUs: the first on "
                  "the GPU ids above, the panel places the others on free GPUs of any host. "
                  "Blank: 1.")
    host = forms.CharField(
        max_length=63, required=False,
        help_text="The fleet host to run on, by its name on the Fleet page, e.g. gpu-host-1; "
                  "blank: the panel chooses.")
    companion = forms.CharField(
        max_length=63, required=False,
        help_text="The name of a deployment of the same target without speculation that serves "
                  "the requests this engine's build refuses (433c58ed7's DFLASH and DDTREE: "
                  "log-probs and grammar; 0.5.23's DFLASH serves both); blank: those get a 400 "
                  "naming the reason.")
    self_check = forms.BooleanField(
        required=False, initial=True, label="GPU self-check before the load",
        help_text="Driver, GPUs, NCCL all-reduce and CUDA graphs at the verify and draft widths, "
                  "in seconds, before the long model load.")
    rebuild_image = forms.BooleanField(
        required=False, label="Rebuild the engine image",
        help_text="Build without the cache even when this recipe's image exists.")
    more_spec = forms.CharField(
        required=False, max_length=4000, label="More spec keys (YAML)",
        widget=forms.Textarea(attrs={"rows": 4, "spellcheck": "false"}),
        help_text="env, secrets, shm_size and restart as in a spec file, one key a line, e.g. "
                  "restart: {policy: on-failure, max_restarts: 5}. Replicas, host and "
                  "companion have their own fields above.")
    confirm_warnings = forms.BooleanField(required=False, label="Deploy despite warnings")

    def __init__(self, *args: Any, recipe: str | None = None, **kwargs: Any) -> None:
        """recipe: the one to start from (the new page's ?recipe=); else the first listed."""
        super().__init__(*args, **kwargs)
        if settings.ENGINE_IMAGE:
            # This panel runs one fixed image (APPLIANCE_ENGINE_IMAGE) and builds nothing.
            del self.fields["rebuild_image"]
        self.recipe_defaults = recipe_defaults()
        # The page's script shows the chosen model's expected load time from these.
        self.store_options = store_model_options()
        if recipe not in self.recipe_defaults:
            recipe = next(iter(self.recipe_defaults), None)
        if recipe is not None:
            # Explicit initial values (the caller's) still win over the recipe's.
            self.initial = {"recipe": recipe, **self.recipe_defaults[recipe], **self.initial}

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        cleaned.setdefault("rebuild_image", False)  # no field with a fixed image
        return cleaned

    def clean_gpu_ids(self) -> list[int]:
        raw = self.cleaned_data.get("gpu_ids") or ""
        try:
            return [int(part) for part in raw.replace(" ", "").split(",") if part]
        except ValueError:
            raise forms.ValidationError("Use comma-separated GPU numbers, e.g. 0,1,2,3.") from None

    def clean_extra_args(self) -> list[str]:
        raw = self.cleaned_data.get("extra_args") or ""
        try:
            return shlex.split(raw)
        except ValueError as exc:
            raise forms.ValidationError(f"Could not split the arguments: {exc}.") from None

    def clean_more_spec(self) -> dict[str, Any]:
        raw = self.cleaned_data.get("more_spec") or ""
        try:
            more = spec_yaml_load(raw) if raw.strip() else {}  # bounded in depth
        except yaml.YAMLError as exc:
            raise forms.ValidationError(f"Not valid YAML: {str(exc)[:200]}") from None
        if not isinstance(more, dict):
            raise forms.ValidationError("Write a mapping, e.g. restart: {policy: on-failure}.")
        own = [key for key in _OWN_FIELD_KEYS if key in more]
        if own:
            raise forms.ValidationError(
                f"{own[0]} has its own field above: set it in {_OWN_FIELD_KEYS[own[0]]} and "
                "take its line out of this box.")
        unknown = sorted(str(k)[:40] for k in more if k not in MORE_SPEC_KEYS)
        if unknown:
            raise forms.ValidationError(
                f"Unknown key {', '.join(unknown)}: this box takes {', '.join(MORE_SPEC_KEYS)}; "
                "the other keys have their own fields above.")
        return more

    def to_spec(self) -> dict[str, Any]:
        data = self.cleaned_data
        engine: dict[str, Any] = {
            "model_path": data["model_path"],
            "tp_size": data["tp_size"],
            "trust_remote_code": True,
            "speculative_algorithm": data["algorithm"],
        }
        if data["algorithm"] != "NONE":
            engine["speculative_draft_model_path"] = data.get("drafter_path") or None
            engine["speculative_num_draft_tokens"] = data.get("block_size")
        if data["algorithm"] == "DDTREE":
            # Overlap scheduling is the recipe's call: 433c58ed7 runs DDTree with it (its V2
            # worker), a recipe on a source that refuses it sets disable_overlap_schedule.
            engine["speculative_ddtree_budget"] = data.get("tree_budget")
        if data.get("attention_backend"):
            engine["attention_backend"] = data["attention_backend"]
        # A model chosen from the store is resolved to its path by the service.
        entries = {"model_entry": data.get("model_entry")}
        if data["algorithm"] != "NONE":
            entries["drafter_entry"] = data.get("drafter_entry")
        return {
            **{key: int(value) for key, value in entries.items() if value},
            "name": data["name"],
            "recipe": data["recipe"],
            "gpus": data["gpu_ids"],
            "engine": {k: v for k, v in engine.items() if v is not None},
            "extra_args": data["extra_args"],
            "self_check": bool(data.get("self_check")),
            "replicas": data.get("replicas") or 1,
            **{key: data[key] for key in ("host", "companion") if data.get(key)},
            **(data.get("more_spec") or {}),
        }

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        for spec_field, messages in errors.items():
            # "extra_args[3]" lands beside the extra arguments, "gpus" beside the GPU ids.
            target = FIELD_OF_SPEC.get(spec_field) or FIELD_OF_SPEC.get(spec_field.split("[")[0])
            for message in messages:
                if target is None:
                    self.add_error(None, f"{spec_field}: {message}")
                else:
                    self.add_error(target, message)
