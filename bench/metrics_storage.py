"""A deployment's metric series: bytes per deployment-day in PostgreSQL, and what one
scrape costs the engine agent.

Storage: a full day of points at the default 2 s interval (43,200, every field set, 8
GPUs or none) goes through the real compaction (web/deployments/services/metrics.py):
the last hour stays at 2 s, the 23 before it become one point a minute. The table
(heap, TOAST and indexes) is measured with pg_total_relation_size after VACUUM FULL,
for that day and for a week of retention.

Scrape: SGLang's real /metrics text of an 8-GPU DFlash engine (tests/fixtures/metrics)
served over loopback HTTP and fetched with the agent's EngineClient, parsed and derived
into a point; then storing a point (one INSERT and the live publish to Redis).

    .venv/bin/python bench/metrics_storage.py \
        --database-url postgres://appliance@127.0.0.1:5440/appliance_metricsbench \
        --redis-url redis://127.0.0.1:6390/5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _loadkit  # noqa: E402

FIXTURE = ROOT / "tests" / "fixtures" / "metrics" / "sglang_0523_dflash_tp8.txt"
DAY_S = 86_400
INTERVAL_S = 2


def _point(t: float, gpus: int, rng: random.Random) -> Any:
    from appliance.runtime import series

    values = {name: rng.uniform(0.001, 400.0) for name in series.SCALARS}
    rows = [[rng.uniform(0, 100), rng.uniform(60, 140), 143.77] for _ in range(gpus)]
    return series.MetricPoint(t=t, gpus=rows, **values)


def _table_bytes() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM FULL ANALYZE deployments_metricpoint")
        cursor.execute("SELECT pg_total_relation_size('deployments_metricpoint')")
        return int(cursor.fetchone()[0])


def _a_day(gpus: int) -> dict[str, float]:
    from web.deployments.models import Deployment, MetricPoint
    from web.deployments.services.metrics import metrics_compact

    MetricPoint.objects.all().delete()
    deployment = Deployment.objects.create(name=f"bench-{gpus}", spec={}, recipe="bench",
                                           algorithm="DDTREE")
    rng = random.Random(gpus)
    start = time.time() // 60 * 60 - DAY_S
    rows = [MetricPoint.of(deployment.pk, _point(start + i * INTERVAL_S, gpus, rng), INTERVAL_S)
            for i in range(DAY_S // INTERVAL_S)]
    MetricPoint.objects.bulk_create(rows, batch_size=2000)
    metrics_compact(deployment_id=deployment.pk, now=start + DAY_S)
    raw = MetricPoint.objects.filter(resolution_s=INTERVAL_S).count()
    minutes = MetricPoint.objects.filter(resolution_s=60).count()
    day = _table_bytes()
    per_row = day / (raw + minutes)
    week = day + 6 * 1440 * per_row  # six more days of one point a minute
    deployment.delete()
    return {"raw": raw, "minutes": minutes, "day": day, "week": week, "per_row": per_row}


class _Metrics(BaseHTTPRequestHandler):
    body = FIXTURE.read_bytes()

    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        return


def _scrape_cost(n: int) -> dict[str, float]:
    from appliance.engine.metrics import parse_metrics
    from appliance.runtime.client import EngineClient
    from appliance.runtime.series import Deriver

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client = EngineClient(f"http://127.0.0.1:{server.server_address[1]}", timeout=2)
    deriver = Deriver()
    fetch, parse = [], []
    for i in range(n):
        t0 = time.perf_counter()
        text = client.metrics_text()
        t1 = time.perf_counter()
        deriver.derive(float(i * INTERVAL_S), parse_metrics(text))
        fetch.append(t1 - t0)
        parse.append(time.perf_counter() - t1)
    server.shutdown()
    return {"fetch_ms": statistics.median(fetch) * 1e3, "parse_ms": statistics.median(parse) * 1e3,
            "bytes": len(_Metrics.body)}


def _store_cost(n: int) -> float:
    from web.deployments.models import Deployment
    from web.deployments.services.metrics import metrics_store_point

    deployment = Deployment.objects.create(name="bench-store", spec={}, recipe="bench",
                                           algorithm="DDTREE")
    rng = random.Random(0)
    took = []
    for i in range(n):
        point = _point(time.time() + i, 8, rng)
        t0 = time.perf_counter()
        metrics_store_point(deployment_id=deployment.pk, point=point, resolution_s=INTERVAL_S)
        took.append(time.perf_counter() - t0)
    deployment.delete()
    return statistics.median(took) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    _loadkit.add_common_args(parser)
    parser.add_argument("--scrapes", type=int, default=500)
    args = parser.parse_args()
    _loadkit.setup_django(args)
    print(f"# {_loadkit.command_line()}")
    for gpus in (8, 0):
        day = _a_day(gpus)
        print(f"storage, {gpus} GPUs: a deployment-day = {day['raw']:.0f} points at 2 s + "
              f"{day['minutes']:.0f} at 1 min = {day['day'] / 1e6:.2f} MB "
              f"({day['per_row']:.0f} bytes a point, indexes included); "
              f"a week of retention = {day['week'] / 1e6:.2f} MB")
    cost = _scrape_cost(args.scrapes)
    print(f"scrape: /metrics of 8 TP ranks ({cost['bytes'] / 1e3:.1f} kB) fetched in "
          f"{cost['fetch_ms']:.2f} ms, parsed and derived in {cost['parse_ms']:.2f} ms "
          f"(medians of {args.scrapes})")
    print(f"store: one point (INSERT + live publish) in {_store_cost(200):.2f} ms (median)")


if __name__ == "__main__":
    main()
