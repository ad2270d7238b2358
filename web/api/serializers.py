from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from web.deployments.models import Event


class DeploymentCreateSerializer(serializers.Serializer[Any]):
    """The deployment spec (appliance.engine.spec schema) plus a confirmation for warnings."""

    spec = serializers.DictField(
        help_text="Deployment spec: name, recipe, gpus, engine, extra_args."
    )
    confirm_warnings = serializers.BooleanField(default=False)
    rebuild_image = serializers.BooleanField(
        default=False, help_text="Build the engine image without the cache even when it exists "
        "(refused where the panel runs a fixed image, APPLIANCE_ENGINE_IMAGE)."
    )

    def validate_rebuild_image(self, value: bool) -> bool:
        if value and settings.ENGINE_IMAGE:
            raise serializers.ValidationError(
                f"This panel runs the fixed image {settings.ENGINE_IMAGE} "
                "(APPLIANCE_ENGINE_IMAGE) and builds nothing: leave rebuild_image out, or unset "
                "APPLIANCE_ENGINE_IMAGE to build images from the recipes.")
        return value


class ScaleSerializer(serializers.Serializer[Any]):
    replicas = serializers.IntegerField(
        help_text="How many engines of the spec to run (1 to 128): missing rows are placed "
        "and started, the highest-index rows beyond are stopped.")


class PreflightSerializer(serializers.Serializer[Any]):
    spec = serializers.DictField()


class EventSerializer(serializers.ModelSerializer[Event]):
    class Meta:
        model = Event
        fields = ["seq", "ts", "kind", "payload"]
        read_only_fields = fields
