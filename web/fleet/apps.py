from django.apps import AppConfig


class FleetConfig(AppConfig):
    """GPU hosts beyond the panel's own: join tokens, each host's credential, drain and
    removal, the deployments placed on each, and the ingest a host writes its events by."""

    name = "web.fleet"
    label = "fleet"
    default_auto_field = "django.db.models.BigAutoField"
