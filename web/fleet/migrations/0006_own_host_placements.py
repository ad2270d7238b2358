"""Every replica row that has not ended gets a Placement on the host it runs on: the rows
of the panel's own host (APPLIANCE_HOST_NAME) had none, since only a joined host's rows
were placed. A row whose recorded host is another name with no Placement is left as it
was (its agent, the panel's, follows rows with no placement). The own host's row is made,
with a credential no secret opens, where its agent never reported.
"""

import secrets

from django.conf import settings
from django.db import migrations
from django.utils import timezone

# fleet.models.UNJOINED_MARK, as it was when this migration was written.
UNJOINED_MARK = "-"
ENDED = ("stopped", "failed")
MAX_REASON = 300
MAX_NAME = 63  # FleetHost.name


def place_own_rows(apps, schema_editor):
    Deployment = apps.get_model("deployments", "Deployment")
    FleetHost = apps.get_model("fleet", "FleetHost")
    Placement = apps.get_model("fleet", "Placement")
    own = str(settings.HOST_NAME)
    if len(own) > MAX_NAME:  # no host row can carry it: its rows stay unplaced, as before
        return
    rows = (Deployment.objects.exclude(status__in=ENDED).filter(placements__isnull=True)
            .filter(host__in=["", own]))
    if not rows.exists():
        return
    host = FleetHost.objects.filter(name=own).first()
    if host is None:
        host = FleetHost.objects.create(
            name=own, credential_prefix=UNJOINED_MARK + secrets.token_hex(7),
            credential_digest=UNJOINED_MARK + secrets.token_hex(31),
            credential_made_at=timezone.now())
    for row in rows:
        Placement.objects.create(deployment=row, replica=row.replica_index, host=host,
                                 reason=(row.placement_reason or "")[:MAX_REASON])


def unplace_own_rows(apps, schema_editor):
    apps.get_model("fleet", "Placement").objects.filter(
        host__name=str(settings.HOST_NAME),
        host__credential_digest__startswith=UNJOINED_MARK).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("fleet", "0005_host_reports_copy"),
        ("deployments", "0018_delete_host"),
    ]

    operations = [migrations.RunPython(place_own_rows, unplace_own_rows)]
