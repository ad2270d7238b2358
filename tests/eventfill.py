"""A long event log written straight into PostgreSQL (generate_series), as a busy deployment's
would be after days: mostly decode lines, each with its metric event, a warning every
WARN_EVERY events, a phase marker every PHASE_EVERY; the newest event is `now`."""

from __future__ import annotations

from django.db import connection

from web.deployments.models import Deployment, Event

WARN_EVERY = 1000
PHASE_EVERY = 50_000

_FILL = f"""
INSERT INTO {Event._meta.db_table} (deployment_id, seq, ts, kind, payload)
SELECT %(pk)s, s, now() - make_interval(secs => (%(last)s - s) * %(step)s),
  CASE WHEN s %% {PHASE_EVERY} = 0 THEN 'phase'
       WHEN s %% 2 = 1 OR s %% {WARN_EVERY} = 0 THEN 'log' ELSE 'metric' END,
  CASE WHEN s %% {PHASE_EVERY} = 0 THEN
         jsonb_build_object('status', 'ready', 'message', 'marker ' || s)
       WHEN s %% {WARN_EVERY} = 0 THEN jsonb_build_object('stream', 'stderr', 'text',
         '[2026-01-01 00:00:00] WARNING: KV cache usage high, line ' || s)
       WHEN s %% 2 = 1 THEN jsonb_build_object('stream', 'stdout', 'text',
         '[2026-01-01 00:00:00] Decode batch, #running-req: 2, #token: 4096, '
         || 'token usage: 0.05, accept len: 3.2' || (s %% 7) || ', accept rate: 0.4, '
         || 'cuda graph: True, gen throughput (token/s): ' || (100 + s %% 50) || '.5, '
         || '#queue-req: 0, line ' || s)
       ELSE jsonb_build_object('line', s - 1, 'kind', 'decode_stats', 'running_req', 2,
         'accept_len', 3.2 + (s %% 7) / 100.0, 'accept_rate', 0.4, 'cuda_graph', true,
         'gen_throughput', 100.5 + s %% 50, 'queue_req', 0, 'token_usage', 0.05)
  END
FROM generate_series((%(first)s)::bigint, (%(last)s)::bigint) AS s
"""
# The casts: with server-side binding (web/settings.py) the seqs arrive as typed
# parameters, and generate_series(smallint, smallint) has no single candidate.


def fill_events(*, deployment_id: int, count: int, step_s: float = 0.07) -> int:
    """Append `count` events after the deployment's last seq, `step_s` apart, ending now;
    returns the new last seq."""
    first = Deployment.objects.values_list("last_seq", flat=True).get(pk=deployment_id) + 1
    last = first + count - 1
    with connection.cursor() as cursor:
        cursor.execute(_FILL, {"pk": deployment_id, "first": first, "last": last,
                               "step": step_s})
        cursor.execute(f"ANALYZE {Event._meta.db_table}")
    Deployment.objects.filter(pk=deployment_id).update(last_seq=last)
    return last


def fill_sql(*, deployment_id: int, count: int, step_s: float = 0.07) -> str:
    """The same fill as one psql script, for a database this process does not connect to
    (compose's PostgreSQL, through `docker-compose exec -T postgres psql`). It claims its seqs
    as events_append does (last_seq moved in the same statement, the row locked meanwhile), so
    a live agent appending to the deployment interleaves safely. Prints the seq of the newest
    event a log pane shows (a log line or a phase)."""
    claim = "(SELECT last_seq FROM claim)"
    insert = _FILL % {"pk": int(deployment_id), "first": f"{claim} - {int(count) - 1}",
                      "last": claim, "step": float(step_s)}
    deployments = Deployment._meta.db_table
    return (f"WITH claim AS (UPDATE {deployments} SET last_seq = last_seq + {int(count)} "
            f"WHERE {Deployment._meta.pk.column} = {int(deployment_id)} RETURNING last_seq),\n"
            f"filled AS ({insert.strip()}\nRETURNING seq, kind)\n"
            "SELECT max(seq) FROM filled WHERE kind <> 'metric';\n"
            f"ANALYZE {Event._meta.db_table};\n")
