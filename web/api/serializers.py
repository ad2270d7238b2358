from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from web.deployments.models import Deployment, Event
from web.deployments.simulator import image_is_simulator, simulator_images_recent


class DeploymentSerializer(serializers.ModelSerializer[Deployment]):
    class Meta:
        model = Deployment
        fields = [
            "id", "name", "status", "phase", "recipe", "algorithm", "gpus", "spec", "progress",
            "decode_stats", "diagnosis", "last_lines", "preflight", "image", "container_name",
            "engine_url", "rebuild_image", "last_seq", "created_at", "updated_at", "ready_at",
            "ended_at", "run", "restarts", "restart_not_before", "load_estimate", "rolling",
            # Where this row runs and why (web/fleet/placement.py); a replica row names its
            # replica 0 (replica_of) and its index; GET replicas/ lists them all.
            "host", "placement_reason", "replica_of", "replica_index", "draining",
            # The Tune that holds it now ({} when none): its id, what it holds, until when.
            "tune_hold",
        ]
        read_only_fields = fields

    def to_representation(self, instance: Deployment) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(instance)
        # Whether its engine is the simulator (the test engine, not SGLang), as every page's
        # banner and every result says: an API client is told too.
        data["simulator"] = image_is_simulator(image=instance.image,
                                               images=simulator_images_recent())
        return data


_DEPLOYMENT: DeploymentSerializer | None = None


def deployment_data(deployment: Deployment) -> dict[str, Any]:
    """DeploymentSerializer(deployment).data, from one serializer made once: a
    ModelSerializer builds its fields from the model each time it is made (a profile,
    docs/performance.md: most of a detail read's serializing), and its fields keep no
    per-object state, so one instance represents every deployment, in any thread."""
    global _DEPLOYMENT
    if _DEPLOYMENT is None:
        made = DeploymentSerializer()
        made.fields  # noqa: B018 - built before it is shared
        _DEPLOYMENT = made
    return _DEPLOYMENT.to_representation(deployment)


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
