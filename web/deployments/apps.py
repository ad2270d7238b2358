from django.apps import AppConfig


class DeploymentsConfig(AppConfig):
    name = "web.deployments"
    label = "deployments"
    default_auto_field = "django.db.models.BigAutoField"
