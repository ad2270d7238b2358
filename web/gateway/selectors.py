"""Reads for the gateway: where it is, which keys may call a deployment, and the lookups each
proxied request makes (a key by its secret, a deployment by model: the name a deployment is
called by is its own, web/deployments/services/served_names.py).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import connection
from django.db.models import OuterRef, Q, Subquery
from django.db.models.fields.json import KT
from django.http import HttpRequest

from appliance.engine.refusals import recipe_source
from web.deployments.models import ACTIVE_STATUSES, Deployment, DeploymentStatus
from web.deployments.services.served_names import served_model_name
from web.deployments.simulator import image_is_simulator, simulator_images_recent
from web.fleet.models import FleetHost, Placement
from web.fleet.selectors import engine_key
from web.gateway.models import ApiKey, ApiKeyUsage

KEY_PREFIX = "sk-sd-"
PREFIX_LENGTH = 8  # characters after KEY_PREFIX that name a key in lists


@dataclass(frozen=True)
class UsageRow:
    """A key's use of one deployment: the requests its engines answered, and their tokens."""

    deployment: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    last_used_at: datetime | None
    deployment_id: int = 0
    model: str = ""  # the name clients call it by
    # The deployments that name this one as their companion: its requests here are those
    # they refused (log-probs, grammar) and it served in their stead.
    companion_of: list[str] = field(default_factory=list)

    @property
    def served(self) -> str:
        return (f"{self.deployment} (companion of {', '.join(self.companion_of)})"
                if self.companion_of else self.deployment)


@dataclass(frozen=True)
class ApiKeyInfo:
    """A key as lists show it: never the secret, only the prefix that names it."""

    id: int
    name: str
    prefix: str  # e.g. "sk-sd-1a2b3c4d"
    owner: str
    all_deployments: bool
    deployment_names: list[str]
    rate_limit_per_minute: int | None
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    # The totals per deployment that served (a companion's share on its own row).
    usage: tuple[UsageRow, ...] = ()

    @property
    def scope(self) -> str:
        return "all deployments" if self.all_deployments else ", ".join(
            self.deployment_names) or "no deployment"


@dataclass(frozen=True)
class KeyGrant:
    """What one request's key may do, read once per request by the proxy."""

    id: int
    owner_id: int
    revoked: bool
    all_deployments: bool
    deployment_ids: frozenset[int] = field(default_factory=frozenset)
    rate_limit_per_minute: int | None = None

    def allows(self, deployment_id: int) -> bool:
        return self.all_deployments or deployment_id in self.deployment_ids


@dataclass(frozen=True)
class Target:
    """The deployment a request's `model` names."""

    deployment_id: int
    model: str
    status: str
    engine_url: str
    created: int  # Unix time, for /v1/models
    context_length: int | None = None  # the spec's engine.context_length, where it sets one
    # What the engine was started with as --api-key on a fleet host (web/fleet/selectors.py;
    # a panel-host engine has none and ignores the header). Never shown.
    engine_key: str = field(default="", repr=False)
    # Replicas (each a row): the row people see and keys name (replica 0), its own for it.
    group_id: int = 0
    draining: bool = False  # out of the rotation for new requests (a rolling change)
    name: str = ""  # the deployment's name (a spec's `companion:` names another by it)
    algorithm: str = ""  # the spec's speculative_algorithm (NONE, DFLASH, DDTREE, ...)
    companion: str = ""  # the spec's `companion:`, a deployment's name
    # Its engine build, as its recipe pins SGLang (Recipe.source_key: "0.5.23", "433c58ed7");
    # what the engine refuses is the build's (appliance.engine.refusals). "" where unknown.
    engine_source: str = ""
    # Where its heartbeat comes from: "fleet:<host id>" (placed on a joined host) or
    # "agent:<agent id>" (the panel's own host, the agent that claimed it); "" none yet.
    host_key: str = ""
    replica_index: int = 0
    # Its image is the simulator's (web/deployments/simulator.py): its answers say so.
    simulator: bool = False

    def __post_init__(self) -> None:
        if not self.group_id:
            object.__setattr__(self, "group_id", self.deployment_id)

    @property
    def ready(self) -> bool:
        return self.status == DeploymentStatus.READY and bool(self.engine_url)

    @property
    def in_rotation(self) -> bool:
        """Ready and not drained: new requests may go to it (a lost host aside)."""
        return self.ready and not self.draining


def gateway_base_url(*, request: HttpRequest) -> str:
    """The OpenAI base URL clients use, on the panel's own origin (e.g. http://host:8000/v1)."""
    return request.build_absolute_uri("/v1")


def secret_digest(secret: str) -> str:
    """Keys are 256-bit random, so one SHA-256 is enough (no stretching needed, as for
    knox's tokens): a lookup by digest, the secret never stored."""
    return hashlib.sha256(secret.encode()).hexdigest()


def key_grant(*, secret: str) -> KeyGrant | None:
    """The key a presented secret is, or None when it is no key of ours."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 128:
        return None
    row = (ApiKey.objects.filter(digest=secret_digest(secret))
           .values("id", "owner_id", "revoked_at", "all_deployments", "rate_limit_per_minute")
           .first())
    if row is None:
        return None
    ids: frozenset[int] = frozenset()
    if not row["all_deployments"]:
        ids = frozenset(ApiKey.deployments.through.objects.filter(
            apikey_id=row["id"]).values_list("deployment_id", flat=True))
    return KeyGrant(id=row["id"], owner_id=row["owner_id"], revoked=row["revoked_at"] is not None,
                    all_deployments=row["all_deployments"], deployment_ids=ids,
                    rate_limit_per_minute=row["rate_limit_per_minute"])


_COLUMNS = ("id", "name", "status", "engine_url", "served", "created_at", "context",
            "replica_of_id", "draining", "algorithm", "companion_name", "placed_on", "agent_id",
            "replica_index", "start_token", "recipe", "image")


def _annotated(rows: Any) -> Any:
    # KT: the name as text (#>>), so the rows need none of the ORM's JSON decoding.
    placed = Subquery(Placement.objects.filter(deployment=OuterRef("pk"))
                      .order_by("replica").values("host_id")[:1])
    return rows.annotate(served=KT("spec__engine__served_model_name"),
                         context=KT("spec__engine__context_length"),
                         companion_name=KT("spec__companion"), placed_on=placed)


def _targets_query() -> Any:
    return (_annotated(Deployment.objects.filter(status__in=ACTIVE_STATUSES))
            .order_by("-created_at", "-id").values_list(*_COLUMNS))


_TARGETS_SQL: list[tuple[str, tuple[Any, ...]]] = []


def gateway_targets() -> list[Target]:
    """Every active deployment as the gateway routes to it, newest first.

    The gateway reads this every second in a thread of the panel's serving process: its SQL
    is the ORM's, compiled once (the compile held the interpreter for about a millisecond
    while requests waited on the event loop)."""
    if not _TARGETS_SQL:
        _TARGETS_SQL.append(_targets_query().query.sql_with_params())
    sql, params = _TARGETS_SQL[0]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    return [_target(*row) for row in rows]


def _target(pk: int, name: str, status: str, engine_url: str, served: str | None,
            created: datetime, context: str | None, replica_of: int | None = None,
            draining: bool = False, algorithm: str = "", companion: str | None = None,
            placed_on: int | None = None, agent_id: str = "", replica_index: int = 0,
            start_token: str = "", recipe: str = "", image: str = "") -> Target:
    host_key = f"fleet:{placed_on}" if placed_on else (f"agent:{agent_id}" if agent_id else "")
    return Target(deployment_id=pk, model=str(served or name), status=status,
                  engine_url=engine_url, created=int(created.timestamp()),
                  context_length=int(context) if context and context.isdigit() else None,
                  group_id=replica_of or pk, draining=bool(draining), name=name,
                  algorithm=(algorithm or "").upper(), companion=companion or "",
                  host_key=host_key, replica_index=replica_index,
                  engine_source=recipe_source(recipe, settings.RECIPES_DIR) or "",
                  engine_key=engine_key(deployment_id=pk, start_token=start_token)
                  if start_token else "",
                  simulator=image_is_simulator(image=image, images=simulator_images_recent()))


# Each host's last heartbeat, keyed as Target.host_key: by the host row (fleet) and by
# the agent that reports on it (agent), from the one host model (fleet.FleetHost). One
# statement, run by the gateway's watch connection each second (web/gateway/routing.py),
# so a lost host leaves the rotation without a database read on any request's path.
HEARTBEATS_SQL = (
    "SELECT 'fleet:' || id::text, extract(epoch FROM heartbeat_at)::float8 "
    "FROM fleet_fleethost WHERE heartbeat_at IS NOT NULL "
    "UNION ALL SELECT 'agent:' || agent_id, extract(epoch FROM heartbeat_at)::float8 "
    "FROM fleet_fleethost WHERE agent_id <> '' AND heartbeat_at IS NOT NULL")


def gateway_heartbeats() -> dict[str, float]:
    """Each host's last heartbeat (Unix time) by Target.host_key."""
    found: dict[str, float] = {
        f"fleet:{pk}": at.timestamp() for pk, at in
        FleetHost.objects.values_list("id", "heartbeat_at") if at is not None}
    for agent_id, at in FleetHost.objects.exclude(agent_id="").values_list("agent_id",
                                                                            "heartbeat_at"):
        if at is not None:
            found[f"agent:{agent_id}"] = max(at.timestamp(), found.get(f"agent:{agent_id}", 0.0))
    return found


def gateway_ended_target(*, model: str) -> Target | None:
    """The newest deployment that served `model` and is no longer active (stopped, failed):
    a call for it is told its status (503), not that no such model exists (404)."""
    row = (_annotated(Deployment.objects.exclude(status__in=ACTIVE_STATUSES))
           .filter(Q(served=model) | ((Q(served__isnull=True) | Q(served="")) & Q(name=model)))
           .order_by("-created_at", "-id").values_list(*_COLUMNS).first())
    return None if row is None else _target(*row)


def gateway_target(*, model: str) -> Target | None:
    """The deployment serving `model`: a ready one first (the newest), else any active one
    (the caller answers 503: not ready yet), else None (404)."""
    named = [t for t in gateway_targets() if t.model == model]
    ready = [t for t in named if t.ready]
    candidates = ready or named
    return candidates[0] if candidates else None


def _infos(keys: list[ApiKey]) -> list[ApiKeyInfo]:
    per_deployment = _usage_rows([key.id for key in keys]) if keys else {}
    out = []
    for key in keys:
        rows = per_deployment.get(key.id, [])  # the totals are their sums
        out.append(ApiKeyInfo(
            id=key.id, name=key.name, prefix=KEY_PREFIX + key.prefix, owner=str(key.owner),
            all_deployments=key.all_deployments,
            deployment_names=sorted({d.name for d in key.deployments.all()}),
            rate_limit_per_minute=key.rate_limit_per_minute, created_at=key.created_at,
            last_used_at=key.last_used_at, revoked_at=key.revoked_at,
            requests=sum(r.requests for r in rows),
            prompt_tokens=sum(r.prompt_tokens for r in rows),
            completion_tokens=sum(r.completion_tokens for r in rows),
            usage=tuple(rows)))
    return out


def apikey_list(*, owner: AbstractBaseUser | AnonymousUser | None = None,
                include_revoked: bool = True) -> list[ApiKeyInfo]:
    """Keys with their usage totals: one owner's, or everyone's when owner is None."""
    keys = ApiKey.objects.select_related("owner").prefetch_related("deployments")
    if owner is not None:
        keys = keys.filter(owner_id=owner.pk)
    if not include_revoked:
        keys = keys.filter(revoked_at__isnull=True)
    return _infos(list(keys))


def apikey_get(*, key_id: int, owner: AbstractBaseUser | AnonymousUser | None = None
               ) -> ApiKeyInfo | None:
    keys = ApiKey.objects.filter(pk=key_id)
    if owner is not None:
        keys = keys.filter(owner_id=owner.pk)
    found = _infos(list(keys.select_related("owner").prefetch_related("deployments")))
    return found[0] if found else None


def api_keys_for_deployment(*, user: AbstractBaseUser | AnonymousUser,
                            deployment: Deployment) -> list[ApiKeyInfo]:
    """The user's unrevoked keys that may call this deployment (never a secret)."""
    if not user.is_authenticated:
        return []
    keys = (ApiKey.objects.filter(owner_id=user.pk, revoked_at__isnull=True)
            .filter(Q(all_deployments=True) | Q(deployments=deployment)).distinct()
            .select_related("owner").prefetch_related("deployments"))
    return _infos(list(keys))


def _usage_rows(key_ids: list[int]) -> dict[int, list[UsageRow]]:
    """Each key's usage rows, per deployment that served (the gateway counts a request on
    the deployment whose engine answered: replica 0's row for any of its replicas, the
    companion's for what a companion served), with the deployments each one is the
    companion of. Two queries however many keys."""
    rows = list(ApiKeyUsage.objects.filter(key_id__in=key_ids)
                .select_related("deployment").order_by("deployment__name", "deployment_id"))
    names = {r.deployment.name for r in rows}
    companion_of: dict[str, set[str]] = {}
    for name, companion in (Deployment.objects.filter(replica_of=None, spec__companion__in=names)
                            .values_list("name", "spec__companion")):
        companion_of.setdefault(str(companion), set()).add(name)
    out: dict[int, list[UsageRow]] = {}
    for r in rows:
        out.setdefault(int(r.key_id or 0), []).append(UsageRow(
            deployment=r.deployment.name, deployment_id=r.deployment_id,
            model=served_model_name(deployment=r.deployment),
            companion_of=sorted(companion_of.get(r.deployment.name, ())),
            requests=r.requests, prompt_tokens=r.prompt_tokens,
            completion_tokens=r.completion_tokens, last_used_at=r.last_used_at))
    return out
