from django.apps import AppConfig


class StoreConfig(AppConfig):
    """The model store: weights in the configured roots, downloads, verification."""

    name = "web.store"
    label = "store"
    default_auto_field = "django.db.models.BigAutoField"
