"""A deployment as the API shows it: the detail read's representation, which the row's
writers also render ahead of the reads (bodies.py)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from .models import Deployment
from .simulator import image_is_simulator, simulator_images_recent


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
