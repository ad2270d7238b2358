"""The new-deployment form: flat fields a person fills in, turned into the shared spec."""

from __future__ import annotations

import shlex
from typing import Any

from django import forms

ALGORITHMS = [("NONE", "None (autoregressive)"), ("DFLASH", "DFlash"), ("DDTREE", "DDTree")]

# Spec field path -> form field, so the service's errors land beside the right input.
FIELD_OF_SPEC = {
    "name": "name",
    "recipe": "recipe",
    "gpus": "gpu_ids",
    "extra_args": "extra_args",
    "engine.model_path": "model_path",
    "engine.speculative_draft_model_path": "drafter_path",
    "engine.speculative_algorithm": "algorithm",
    "engine.speculative_num_draft_tokens": "block_size",
    "engine.speculative_dflash_block_size": "block_size",
    "engine.speculative_ddtree_budget": "tree_budget",
    "engine.tp_size": "tp_size",
    "engine.attention_backend": "attention_backend",
    "self_check": "self_check",
    "confirm_warnings": "confirm_warnings",
}


def _recipe_choices() -> list[tuple[str, str]]:
    from .services import recipe_names

    return [(name, name) for name in recipe_names()]


class DeploymentForm(forms.Form):
    name = forms.SlugField(max_length=63, help_text="Letters, digits and hyphens.")
    recipe = forms.ChoiceField(choices=_recipe_choices)
    model_path = forms.CharField(max_length=500, help_text="Path of the target model's weights.")
    drafter_path = forms.CharField(max_length=500, required=False,
                                   help_text="Path of the DFlash drafter (DFlash and DDTree).")
    algorithm = forms.ChoiceField(choices=ALGORITHMS, initial="DDTREE")
    block_size = forms.IntegerField(min_value=1, max_value=64, required=False, initial=8)
    tree_budget = forms.IntegerField(min_value=1, max_value=512, required=False, initial=32)
    tp_size = forms.IntegerField(min_value=1, max_value=64, initial=8, label="TP size")
    gpu_ids = forms.CharField(max_length=200, required=False, initial="0,1,2,3,4,5,6,7",
                              label="GPU ids", help_text="Comma-separated, e.g. 0,1,2,3.")
    attention_backend = forms.CharField(max_length=40, required=False, initial="fa3")
    extra_args = forms.CharField(max_length=2000, required=False,
                                 label="Extra engine arguments",
                                 help_text="Further SGLang flags, e.g. --mem-fraction-static 0.85")
    self_check = forms.BooleanField(
        required=False, initial=True, label="GPU self-check before the load",
        help_text="Driver, GPUs, NCCL all-reduce and CUDA graphs at the verify and draft widths, "
                  "in seconds, before the long model load.")
    rebuild_image = forms.BooleanField(
        required=False, label="Rebuild the engine image",
        help_text="Build without the cache even when this recipe's image exists.")
    confirm_warnings = forms.BooleanField(required=False, label="Deploy despite warnings")

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
            engine["speculative_ddtree_budget"] = data.get("tree_budget")
            # The DDTree source's worker refuses the overlap scheduler (pre-flight says so too).
            engine["disable_overlap_schedule"] = True
        if data.get("attention_backend"):
            engine["attention_backend"] = data["attention_backend"]
        return {
            "name": data["name"],
            "recipe": data["recipe"],
            "gpus": data["gpu_ids"],
            "engine": {k: v for k, v in engine.items() if v is not None},
            "extra_args": data["extra_args"],
            "self_check": bool(data.get("self_check")),
        }

    def add_service_errors(self, errors: dict[str, list[str]]) -> None:
        for spec_field, messages in errors.items():
            target = FIELD_OF_SPEC.get(spec_field)
            for message in messages:
                if target is None:
                    self.add_error(None, f"{spec_field}: {message}")
                else:
                    self.add_error(target, message)
