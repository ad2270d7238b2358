"""Every host's report in one model: each deployments.Host row gets its FleetHost. A host
that has one (a joined host) takes the row's report; one that has none (the panel's own
host on an upgraded install) gets a row whose credential no secret opens
(fleet.models.unjoined_credential: a join with a token replaces it), with its heartbeat,
Docker facts, telemetry and, from the telemetry, its GPUs.
"""

import secrets

from django.db import migrations

# fleet.models.UNJOINED_MARK, as it was when this migration was written.
UNJOINED_MARK = "-"
MAX_NAME = 63  # FleetHost.name; a longer Host name (none an agent writes) cannot be one
GPU_KEYS = ("index", "name", "uuid", "memory_total_gb", "compute_capability")


def gpus_of(telemetry):
    """(gpus, gpu_source) as a heartbeat's NVML list gives them; none without NVML."""
    listed = [g for g in (telemetry or {}).get("gpus") or []
              if isinstance(g, dict) and isinstance(g.get("index"), int)]
    if not (telemetry or {}).get("available") or not listed:
        return [], ""
    return [{k: g[k] for k in GPU_KEYS if k in g} for g in listed], "nvml"


def copy_hosts(apps, schema_editor):
    Host = apps.get_model("deployments", "Host")
    FleetHost = apps.get_model("fleet", "FleetHost")
    for report in Host.objects.all():
        if len(report.name) > MAX_NAME:
            continue
        facts = {"agent_id": report.agent_id, "gpu_telemetry": report.gpu_telemetry or {},
                 "secret_names": report.secret_names or [],
                 "foreign_containers": report.foreign_containers or []}
        if FleetHost.objects.filter(name=report.name).update(**facts):
            continue
        gpus, source = gpus_of(report.gpu_telemetry)
        FleetHost.objects.create(
            name=report.name, credential_prefix=UNJOINED_MARK + secrets.token_hex(7),
            credential_digest=UNJOINED_MARK + secrets.token_hex(31),
            credential_made_at=report.heartbeat_at, heartbeat_at=report.heartbeat_at,
            docker=report.docker or {}, gpus=gpus, gpu_source=source, **facts)


def remove_unjoined(apps, schema_editor):
    apps.get_model("fleet", "FleetHost").objects.filter(
        credential_digest__startswith=UNJOINED_MARK).delete()


class Migration(migrations.Migration):
    """Apart from 0004: a reversal deletes rows, which PostgreSQL will not do in the
    transaction that then alters their table."""

    dependencies = [
        ("fleet", "0004_host_reports"),
        ("deployments", "0017_gpulease_to_fleet"),
    ]

    operations = [migrations.RunPython(copy_hosts, remove_unjoined)]
