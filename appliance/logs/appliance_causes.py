"""The causes the appliance names itself, not from a needle in the engine's log: an engine
container Docker would not start, an image build that failed, a model the store has not
verified, and what the follower sees of an engine (it timed out, vanished, exited, was
killed for host memory). With the engine's own causes (appliance.logs.causes) they make the
one failure catalogue (appliance.logs.catalogue), linted and listed together.

None of these is ranked against the engine's log causes (appliance.logs.diagnosis picks
among those alone), so their priority is 0; each is found where it happens: start_failure
reads Docker's message, the build, the model wait and the follower name theirs.
"""

from __future__ import annotations

import signal

from appliance.logs.cause import Cause, Diagnosis
from appliance.logs.causes import CAUSES as ENGINE_CAUSES

_UNRECOGNISED_FIX = "Read the engine's last lines below; the cause was not recognised."

NO_NVIDIA_FIX = (
    "Install the NVIDIA Container Toolkit on the host and register its runtime with Docker "
    "(`nvidia-ctk runtime configure --runtime=docker`, then restart dockerd), or generate CDI "
    "specs (`nvidia-ctk cdi generate`). On a machine without GPUs, run the test engine with "
    "APPLIANCE_ENGINE_GPU_REQUESTS=false."
)

# ---- the engine container would not start (Docker's message)
NO_GPU_RUNTIME = Cause(
    "no-gpu-runtime",
    "This host's Docker has no NVIDIA runtime, so it cannot give the engine its GPUs.",
    NO_NVIDIA_FIX, 0)
IMAGE_MISSING = Cause(
    "image-missing", "The engine image is not on this Docker engine.",
    "Build the image (deploy from a recipe, or `appliance build RECIPE`) or set "
    "APPLIANCE_ENGINE_IMAGE to an image that exists here (`docker images`).", 0)
SECRET_MISSING = Cause(
    "secret-missing", "A secret the spec declares is not in the secret store.",
    "Put its value in the file ./engine-secrets/<NAME> on the host (the folder "
    "APPLIANCE_ENGINE_SECRETS_HOST_DIR names; compose mounts it into the agent), or set "
    "APPLIANCE_ENGINE_SECRET_<NAME> in the agent's environment; then press Restart.", 0)
ENGINE_NETWORK_MISSING = Cause(
    "engine-network-missing", "The engine network does not exist.",
    "Start the appliance with `docker compose up` (the agent creates the network), or set "
    "APPLIANCE_ENGINE_NETWORK to an existing network.", 0)
DOCKER_UNREACHABLE = Cause(
    "docker-unreachable", "The agent cannot reach the Docker engine.",
    "Check that dockerd runs and that /var/run/docker.sock is mounted into the agent.", 0)
ENGINE_START_FAILED = Cause(
    "engine-start-failed", "The engine container could not start.",
    "Read Docker's message above; `docker info` and `docker images` on the host show what "
    "it has.", 0)

# ---- the image build and the model store
IMAGE_BUILD_FAILED = Cause(
    "image-build-failed", "A step of the engine image's build failed.",
    "Read the failing build step below; fix the recipe or the patch it names.", 0)
MODEL_NOT_READY = Cause(
    "model-not-ready", "The engine was not started: a model it names is not verified in the "
    "model store.",
    "Resume or repeat the download on the store page, then deploy again.", 0)
MODEL_DOWNLOAD_FAILED = Cause(
    "model-download-failed", "A model the deployment waited for failed or was cancelled in "
    "the model store; a partial or failed model is never mounted into an engine.",
    "Resume or repeat the download on the store page, then deploy again.", 0)

# ---- what the follower sees of the engine, where its log names no cause
ENGINE_TIMEOUT = Cause(
    "engine-timeout", "The engine was not ready within the deployment's ready timeout.",
    _UNRECOGNISED_FIX, 0)
ENGINE_VANISHED = Cause(
    "engine-vanished", "The engine container is gone.",
    "Redeploy; check `docker ps -a` for who removed it.", 0)
GENERATION_FAILED = Cause(
    "generation-failed", "/health was 200 but a one-token generation failed.",
    _UNRECOGNISED_FIX, 0)
ENGINE_EXITED = Cause(
    "engine-exited", "The engine container exited.", _UNRECOGNISED_FIX, 0)
ENGINE_OOM_KILLED = Cause(
    "engine-oom-killed", "The engine was killed for lack of host memory (OOM).",
    "Give the engine more host memory or lower its CPU-side caches.", 0)
UNKNOWN_ERROR = Cause(
    "unknown-error", "The engine failed with an error the catalogue does not know.",
    "Read the traceback and the lines before it.", 0)

APPLIANCE_CAUSES: tuple[Cause, ...] = (
    NO_GPU_RUNTIME, IMAGE_MISSING, SECRET_MISSING, ENGINE_NETWORK_MISSING, DOCKER_UNREACHABLE,
    ENGINE_START_FAILED, IMAGE_BUILD_FAILED, MODEL_NOT_READY, MODEL_DOWNLOAD_FAILED,
    ENGINE_TIMEOUT, ENGINE_VANISHED, GENERATION_FAILED, ENGINE_EXITED, ENGINE_OOM_KILLED,
    UNKNOWN_ERROR,
)

# Start errors Docker reports, and the cause of each (first match wins). An entry matches
# when every word of one of its needle groups ("a|b" means both) is in the message, in any
# case. A taken port is the engine's own port-in-use: one cause, whoever reports it.
START_ERRORS: tuple[tuple[tuple[str, ...], Cause], ...] = (
    (("could not select device driver", "no NVIDIA runtime", "nvidia-container-cli"),
     NO_GPU_RUNTIME),
    (("is not on this Docker engine", "No such image", "pull access denied"), IMAGE_MISSING),
    (("is not in the secret store", "cannot be read from"), SECRET_MISSING),
    (("port is already allocated", "address already in use"), ENGINE_CAUSES["port-in-use"]),
    (("network|not found",), ENGINE_NETWORK_MISSING),
    (("cannot reach the Docker engine", "Connection refused", "No such file or directory"),
     DOCKER_UNREACHABLE),
)


DOCKER_LOST_CODE = 255  # what Docker records for a container whose process it lost
NO_LINES_FIX = ("The engine printed no line in this run, so there is none to read: the host's "
                "Docker log (`journalctl -u docker`) and `docker inspect` of the engine's "
                "container, where it is still there, say what ended it.")
HOST_RESTART_FIX = (
    "Nothing to fix in the engine: its host or the host's Docker restarted while it ran "
    "(`uptime`, `journalctl -u docker` on the host say when). A replica or a companion is "
    "started again by the panel; a deployment of its own is started again by Restart, or by "
    "itself with `restart: {policy: on-failure}` in its spec.")


def exit_message(code: object, when: str) -> str:
    """How the engine's container ended, from Docker's exit code: a code above 128 names
    the signal that killed it only where there is such a signal (129 to 192); 255 is
    Docker's own code for a process it lost (its dockerd or the host restarted), never
    "signal 127"."""
    if code == DOCKER_LOST_CODE:
        return (f"the engine container ended with exit code 255 {when}: Docker's code for a "
                "container whose process it lost, as when the host or its Docker restarted "
                "under it (no signal)")
    if isinstance(code, int) and 128 < code <= 128 + 64:
        try:
            name = f" ({signal.Signals(code - 128).name})"
        except ValueError:
            name = ""
        return f"the engine was killed by signal {code - 128}{name} {when}"
    return f"the engine container exited with code {code} {when}"


def exit_diagnosis(code: object, message: str, evidence: dict[str, object]) -> Diagnosis:
    """ENGINE_EXITED worded for the exit: for Docker's 255, that its host or Docker
    restarted (not a cause to look for in the engine's lines)."""
    if code == DOCKER_LOST_CODE:
        return ENGINE_EXITED.worded(summary=message[:1].upper() + message[1:] + ".",
                                    fix=HOST_RESTART_FIX, evidence=evidence)
    return ENGINE_EXITED.worded(summary=message, evidence=evidence)


def without_lines(diagnosis: Diagnosis) -> Diagnosis:
    """The diagnosis of an engine that printed no line: a fix that sends the reader to the
    lines below says where to look instead."""
    if "last lines below" not in diagnosis.fix:
        return diagnosis
    return Diagnosis(diagnosis.cause, diagnosis.summary, NO_LINES_FIX, dict(diagnosis.evidence),
                     diagnosis.patch, diagnosis.severity)


def start_failure(message: str) -> Diagnosis:
    """The diagnosis of an engine that could not be started, from Docker's message."""
    lowered = message.lower()
    evidence = {"docker": message}
    for groups, cause in START_ERRORS:
        if any(all(word.lower() in lowered for word in group.split("|")) for group in groups):
            return cause.worded(evidence=evidence)
    return ENGINE_START_FAILED.worded(
        summary=f"The engine container could not start: {message}", evidence=evidence)
