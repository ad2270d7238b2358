"""Tune's Deployer (appliance.tune's protocol) on this panel: each candidate as a redeploy of
the deployment's own row (in place), or as a deployment of its own on free GPUs beside it
(side by side); the restore gives the deployment back as it was. Each wait is bounded and
polls the row every POLL_S."""

from __future__ import annotations

import time
from typing import Any

from django.conf import settings

from appliance.lifecycle import Process
from appliance.tune import Candidate, DeployFailed, candidate_spec
from web.deploy import checks
from web.deploy import services as deploying
from web.deployments import services as deployments
from web.deployments.models import TERMINAL_STATUSES, Deployment, DeploymentStatus
from web.deployments.services.lifecycle import (
    deployment_mark_stopped,
    deployment_mark_stopping,
)

from .tune_models import TuneRun

STOP_WAIT_S = 60.0  # beyond the engine's own stop timeout
POLL_S = 0.5


class PanelDeployer:
    """Each candidate as a redeploy of the deployment's own row, replica 0 (its GPUs, its
    name, its keys), drained out of the gateway's rotation, waiting on its status; the
    restore redeploys the spec it had and puts it back in the rotation. With replicas,
    replica 0 alone stops and starts (the others keep serving). Runs on the Tune's thread:
    its own database connection, closed by the caller."""

    def __init__(self, run: TuneRun) -> None:
        self.pk = int(run.original["id"])
        self.run_id = run.pk
        self.original = run.original
        self.user = run.created_by
        self.deploy_timeout_s = float(run.config.get("deploy_timeout_s", 1800))
        self.images: set[str] = set()

    def _group(self) -> bool:
        return Deployment.objects.filter(replica_of_id=self.pk).exists()

    def _spec(self, candidate: Candidate) -> dict[str, Any]:
        return candidate_spec(self.original["spec"], candidate)

    def preflight(self, candidate: Candidate) -> list[str]:
        try:
            # Checked on replica 0's host, where a candidate runs (or, side by side, beside it).
            hosts = deployments.deployment_hosts(deployment_id=self.pk, alone=True)
            checks.deployment_validate(data=self._spec(candidate), hosts=hosts)
        except deployments.DeploymentInputError as exc:
            return [f"{field}: {' '.join(msgs)}" for field, msgs in exc.errors.items()]
        return []

    def stop_engine(self) -> None:
        Deployment.objects.filter(pk=self.pk).update(draining=True)
        if self._group():  # replica 0 alone; a queued one stops at once
            if not deployment_mark_stopped(deployment_id=self.pk, by=Process.WEB):
                deployment_mark_stopping(deployment_id=self.pk, message=(
                    f"Tune #{self.run_id}: replica 0 stops for its next candidate"))
        else:
            deployments.deployment_stop(deployment_id=self.pk)
        bound = time.monotonic() + settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S
        while time.monotonic() < bound:
            if Deployment.objects.filter(pk=self.pk, status__in=list(
                    TERMINAL_STATUSES)).exists():
                return
            time.sleep(POLL_S)
        raise DeployFailed(f"the deployment did not stop within "
                           f"{settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S:g} s")

    def start_spec(self, spec: dict[str, Any]) -> None:
        try:
            if self._group():
                deploying.deployment_run_alone(deployment_id=self.pk, data=spec,
                                               user=self.user, why=f"Tune #{self.run_id}")
            else:
                deploying.deployment_redeploy(deployment_id=self.pk, data=spec,
                                              user=self.user, confirm_warnings=True)
        except deployments.DeploymentInputError as exc:
            raise DeployFailed(f"the redeploy was refused: {exc}") from exc

    def wait_ready(self, stop: Any, timeout_s: float) -> str:
        bound = time.monotonic() + timeout_s
        while time.monotonic() < bound:
            row = Deployment.objects.only("status", "engine_url", "image", "diagnosis").get(
                pk=self.pk)
            if row.status == DeploymentStatus.READY and row.engine_url:
                self.images.add(row.image)
                return str(row.engine_url).rstrip("/")
            if row.status == DeploymentStatus.FAILED:
                cause = (row.diagnosis or {}).get("summary") or (row.diagnosis or {}).get(
                    "title") or "see the deployment's page"
                raise DeployFailed(f"its engine failed: {cause}")
            if row.status == DeploymentStatus.STOPPED:
                raise DeployFailed("the deployment was stopped while it started")
            if stop is not None and stop():
                return ""
            time.sleep(POLL_S)
        raise DeployFailed(f"not ready within {timeout_s:g} s")

    def deploy(self, candidate: Candidate, stop: Any) -> str:
        self.stop_engine()
        self.start_spec(self._spec(candidate))
        return self.wait_ready(stop, self.deploy_timeout_s)

    def restore(self) -> str:
        try:
            row = Deployment.objects.get(pk=self.pk)
            if row.spec == self.original["spec"] and row.status == DeploymentStatus.READY:
                return f"{self.original['name']} still serves its own spec; nothing to restore"
            self.stop_engine()
            self.start_spec(self.original["spec"])
            self.wait_ready(None, self.deploy_timeout_s)
        finally:  # back in the rotation (one that failed to start is out by its status)
            Deployment.objects.filter(pk=self.pk).update(draining=False)
        return (f"{self.original['name']} serves its own spec again (GPUs "
                f"{self.original['gpus']}, served as {self.original['served_model']})")


class SideDeployer(PanelDeployer):
    """Each candidate as a deployment of its own beside the deployment, on the free GPUs the
    Tune chose (`config["side"]`), named `<name>-tune-<id>` and served under that name; the
    deployment serves on, untouched. The restore stops and deletes that side deployment."""

    def __init__(self, run: TuneRun) -> None:
        super().__init__(run)
        self.side = dict(run.config.get("side") or {})
        self.name = side_name(run)
        found = Deployment.objects.filter(name=self.name, replica_of=None).first()
        self.side_pk = found.pk if found is not None else None
        self.pk = self.side_pk or 0

    def _group(self) -> bool:
        return False

    def _spec(self, candidate: Candidate) -> dict[str, Any]:
        spec = candidate_spec(self.original["spec"], candidate)
        spec.update(name=self.name, gpus=list(self.side["gpus"]), replicas=1)
        spec["engine"] = {**spec["engine"], "served_model_name": self.name}
        if self.original.get("rows") and self.original["rows"][0].get("host"):
            spec["host"] = self.original["rows"][0]["host"]
        else:
            spec.pop("host", None)
        return spec

    def deploy(self, candidate: Candidate, stop: Any) -> str:
        if self.side_pk is None:
            try:
                made = deploying.deployment_create(data=self._spec(candidate), user=self.user,
                                                   confirm_warnings=True)
            except deployments.DeploymentInputError as exc:
                raise DeployFailed(f"the side deployment was refused: {exc}") from exc
            self.side_pk = self.pk = made.pk
            return self.wait_ready(stop, self.deploy_timeout_s)
        return super().deploy(candidate, stop)

    def restore(self) -> str:
        where = f"GPUs {self.side.get('gpus')} on {self.side.get('host')}"
        if self.side_pk is None or not Deployment.objects.filter(pk=self.side_pk).exists():
            return (f"nothing ran beside ({where}); {self.original['name']} served "
                    "throughout, untouched")
        deployments.deployment_stop(deployment_id=self.side_pk)
        bound = time.monotonic() + settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S
        while not Deployment.objects.filter(pk=self.side_pk, status__in=list(
                TERMINAL_STATUSES)).exists():
            if time.monotonic() > bound:
                raise DeployFailed(f"the side deployment #{self.side_pk} did not stop "
                                   f"within {settings.ENGINE_STOP_TIMEOUT_S + STOP_WAIT_S:g} s")
            time.sleep(POLL_S)
        deployments.deployment_delete(deployment_id=self.side_pk)
        return (f"the side deployment {self.name} #{self.side_pk} ({where}) stopped and "
                f"deleted; {self.original['name']} served throughout, untouched")


def side_name(run: TuneRun) -> str:
    return f"{str(run.original.get('spec', {}).get('name') or 'tune')[:48].rstrip('-')}" \
           f"-tune-{run.pk}"


def deployer_for(run: TuneRun) -> PanelDeployer:
    if run.config.get("placement") == "side_by_side":
        return SideDeployer(run)
    return PanelDeployer(run)


