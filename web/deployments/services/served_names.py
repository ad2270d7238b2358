"""A served model name (the `model` clients name at the gateway) belongs to one active
deployment: a second one of the same name would be routed to instead of the first (the newest
wins), and a key scoped to the first would list the name and be refused calling it.

The name is the spec's engine.served_model_name, else the deployment's name (as
appliance.engine.launch passes --served-model-name, and web/gateway/selectors.py routes). It
is claimed in the transaction that creates or restarts a deployment, under a PostgreSQL
advisory lock on the name, so two requests for one name cannot both pass the check; the
claim ends with the deployment's active life, with nothing to release. The check is per
deployment, not per engine: replicas of one deployment (replica 0 and the rows that are its
replicas) share its name and count as one.
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.db import connection
from django.db.models import Q
from django.db.models.fields.json import KT

from ..models import ACTIVE_STATUSES, Deployment

NAME_FIELD = "name"
SERVED_FIELD = "engine.served_model_name"


def served_model_name(*, deployment: Deployment) -> str:
    """The `model` a client names: the spec's served_model_name, else the deployment's name
    (appliance.engine.launch passes the same to the engine as --served-model-name)."""
    return str(deployment.engine_options.get("served_model_name") or deployment.name)


def served_name_of(*, spec: dict[str, Any], name: str) -> str:
    engine = spec.get("engine") if isinstance(spec, dict) else None
    served = engine.get("served_model_name") if isinstance(engine, dict) else None
    return str(served or name)


def served_name_holder(*, served: str, exclude_pk: int | None = None,
                       family: int | None = None) -> Deployment | None:
    """The active deployment serving `served`, other than exclude_pk and its replicas
    (replica 0 and its replica rows are one deployment) and the replicas of `family`
    (replica 0's pk), or None. A replica row found stands for its replica 0."""
    named = (Q(served=served) | ((Q(served__isnull=True) | Q(served="")) & Q(name=served)))
    rows = (Deployment.objects.filter(status__in=ACTIVE_STATUSES)
            .annotate(served=KT("spec__engine__served_model_name")).filter(named)
            .only("pk", "name", "status", "replica_of").order_by("created_at", "pk"))
    if exclude_pk is not None:  # the deployment's own replicas serve the same name
        root = (Deployment.objects.filter(pk=exclude_pk).values_list("replica_of_id", flat=True)
                .first()) or exclude_pk
        rows = rows.exclude(Q(pk=root) | Q(replica_of_id=root))
    if family is not None:
        rows = rows.exclude(Q(pk=family) | Q(replica_of_id=family))
    return rows.first()


def served_name_conflict(*, spec: dict[str, Any], name: str, pk: int | None = None,
                         family: int | None = None) -> dict[str, list[str]]:
    """In the caller's transaction, holding the name until it ends: the field error (on the
    field that sets the name) when another active deployment serves this spec's name, else
    an empty mapping."""
    served = served_name_of(spec=spec, name=name)
    _lock(served)
    holder = served_name_holder(served=served, exclude_pk=pk, family=family)
    if holder is None:
        return {}
    if holder.replica_of_id is not None:
        holder = Deployment.objects.only("pk", "name", "status").get(pk=holder.replica_of_id)
    own = isinstance(spec.get("engine"), dict) and bool(spec["engine"].get("served_model_name"))
    other = ("another served model name (engine.served_model_name, or "
             "--served-model-name in the extra arguments)" if own else
             "another name (or set engine.served_model_name, --served-model-name in the extra "
             "arguments)")
    return {SERVED_FIELD if own else NAME_FIELD: [
        f"The served model name {served!r} is already served by deployment #{holder.pk} "
        f"'{holder.name}' ({holder.status}): a served name belongs to one active deployment, "
        f"or the gateway could not tell them apart. Stop #{holder.pk} first, or choose "
        f"{other}."]}


def _lock(served: str) -> None:
    """Until the transaction ends, the only one checking and taking this name. SQLite (a
    developer's panel) has one writer at a time anyway."""
    if connection.vendor != "postgresql":
        return
    key = int.from_bytes(hashlib.sha256(b"appliance-served-name:" + served.encode()).digest()[:8],
                         "big", signed=True)
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [key])
