"""Which deployments run the simulator, so that every page and result says so.

An engine image is the simulator when it carries appliance.simulator's label
(`appliance/simulator.py`); web has no Docker socket, so it knows the label from the hosts'
reports: each agent lists its images that carry it (`docker_facts`' `simulator_images`),
the panel's own host's agent in its report and a joined host through its heartbeat
(services/hostreports.py). A deployment
of such an image (its `image` tag) is simulated, and so is every benchmark and
losslessness result that measured it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from django.conf import settings

from appliance.engine.refusals import build_refusals, recipe_source

from .models import Deployment, DeploymentStatus
from .services.hostreports import host_reports

SIMULATOR_MARK = "simulator"
SIMULATOR_NOTE = ("Simulator: engines here run the test engine (docker/test-engine), not "
                  "SGLang. No model runs and no GPU is used: its speeds and acceptance lengths "
                  "replay recordings of the real engine (each engine's log names the one it "
                  "plays), and neither they nor its check results are measurements of this "
                  "machine.")


def simulator_images() -> frozenset[str]:
    """Every image tag a host reported as the simulator's."""
    reported: set[str] = set()
    for docker in host_reports().values_list("docker", flat=True):
        tags = (docker or {}).get("simulator_images") if isinstance(docker, dict) else None
        if isinstance(tags, list):
            reported.update(t for t in tags if isinstance(t, str))
    return frozenset(reported)


# simulator_images() as an answer of the API reads it: at most one query a process every
# SIMULATOR_IMAGES_TTL_S (an image's label never changes; a new host's report is seen within
# that time). The status reads' bodies are made from the row and this alone.
SIMULATOR_IMAGES_TTL_S = 30.0
_images_read: list[tuple[float, frozenset[str]]] = []


def simulator_images_recent() -> frozenset[str]:
    now = time.monotonic()
    if _images_read and now - _images_read[0][0] < SIMULATOR_IMAGES_TTL_S:
        return _images_read[0][1]
    images = simulator_images()
    _images_read[:] = [(now, images)]
    return images


def simulator_images_forget() -> None:
    """Drop the remembered images (a test that changes a host's report)."""
    _images_read.clear()


def image_is_simulator(*, image: str, images: Iterable[str] | None = None) -> bool:
    known = simulator_images() if images is None else images
    return bool(image) and image in known


def simulated_build(*, deployment: Deployment, image: str,
                    images: Iterable[str] | None = None) -> str:
    """The engine build the simulator imitates for this deployment on `image` ('' where the
    image is no simulator): the one the deployment's recipe pins (what it refuses is that
    build's, as the gateway and the deployment's page take it), where the refusal table has
    that build and algorithm; else '' (the simulator's own default). A host's agent puts it
    in the engine's environment (remote_plan) unless that names one already."""
    if not image_is_simulator(image=image, images=images):
        return ""
    source = recipe_source(deployment.recipe, settings.RECIPES_DIR)
    build = build_refusals(source)
    if source and build is not None and build.needs(deployment.algorithm or "NONE") is not None:
        return source
    return ""


def simulator_in_use() -> bool:
    """Whether this panel serves the simulator: the configured engine image is one, or a
    deployment that has not ended runs one."""
    images = simulator_images()
    if not images:
        return False
    if settings.ENGINE_IMAGE and settings.ENGINE_IMAGE in images:
        return True
    ended = [DeploymentStatus.STOPPED, DeploymentStatus.FAILED]
    return Deployment.objects.filter(image__in=images).exclude(status__in=ended).exists()


def simulator_context(request: object) -> dict[str, object]:
    """Template context (settings.TEMPLATES' context processors): every page's banner."""
    return {"simulator_note": SIMULATOR_NOTE if simulator_in_use() else ""}
