from django.apps import AppConfig


class FleetConfig(AppConfig):
    """GPU hosts beyond the panel's own: join tokens, each host's credential, drain and
    removal, the deployments placed on each, and the ingest a host writes its events by;
    the GPU leases of every host, the panel's own included (leases.py)."""

    name = "web.fleet"
    label = "fleet"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # web/deployments takes and gives back GPUs, and reads the hosts' reports, through
        # these hooks only (it imports no other app of web's): registered before any
        # request or job runs. Imported here,
        # not at the top: the models they import load only once the registry is ready.
        from web.deployments.services import gpus, hostreports  # noqa: PLC0415

        from . import leases  # noqa: PLC0415
        from .models import FleetHost  # noqa: PLC0415

        gpus.register(leases)
        hostreports.register(FleetHost)
