from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Who may call the API and how often one may guess a password: hashed API tokens
    (django-rest-knox) and login throttling (django-axes), configured here."""

    name = "web.accounts"
    label = "accounts"
    default_auto_field = "django.db.models.BigAutoField"
