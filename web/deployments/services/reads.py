"""Writes: the status reads' answers, rendered by the deployment row's writers.

A token GET of a deployment's detail or summary (web/api/asgi.py) decoded the row, built
the model, ran the serializer and rendered JSON on every read: the same bytes for every
reader until the row changes. The writers that keep the summary current (a metric point,
alerts, an event appended, which every status change does) now also store what the two
reads return, rendered from the row as it is after their write, with the row's version
(xmin, the ETag's). A read returns those bytes while the version is the row's current
one; a write by any other path makes them unused (the read renders, as before), never
wrong. They are stored after the writer's commit and outside its transaction: a failure
here costs only speed, so it never fails the write (robust on_commit).
"""

from __future__ import annotations

import logging

from django.db import connection, transaction

from ..bodies import BOTH_FIELDS, status_body_render
from ..models import Deployment, StatusBody
from ..selectors import deployment_list, deployment_row_version

log = logging.getLogger(__name__)


def deployment_status_bodies_later(*, deployment_id: int) -> None:
    """deployment_status_bodies_store once the current transaction commits (at once
    outside one); its errors are logged, the writer's commit stands."""
    if connection.vendor == "postgresql":
        transaction.on_commit(lambda: deployment_status_bodies_store(
            deployment_id=deployment_id), robust=True)


def deployment_status_bodies_store(*, deployment_id: int) -> bool:
    """Render the detail and the summary from the row as it is now and store them with its
    version, if it is still the row's when they are stored (a write in between makes them
    unused, so they are not kept). True when stored."""
    deployment = (deployment_list(versioned=True).filter(pk=deployment_id).order_by()
                  .only(*BOTH_FIELDS).first())
    version = None if deployment is None else deployment_row_version(deployment=deployment)
    if deployment is None or version is None:
        return False
    detail = status_body_render(deployment=deployment, url_name="deployment-detail")
    summary = status_body_render(deployment=deployment, url_name="deployment-summary")
    q = connection.ops.quote_name
    table, rows = q(StatusBody._meta.db_table), q(Deployment._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (deployment_id, version, detail, summary) "
            f"SELECT d.id, %s, %s, %s FROM {rows} d WHERE d.id = %s AND d.xmin::text = %s "
            "ON CONFLICT (deployment_id) DO UPDATE SET version = EXCLUDED.version, "
            "detail = EXCLUDED.detail, summary = EXCLUDED.summary",
            [version, detail, summary, deployment_id, version])
        return bool(cursor.rowcount)
