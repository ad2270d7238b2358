from django.urls import path

from . import views

app_name = "gateway"
urlpatterns = [
    path("", views.keys_page, name="keys"),
    path("<str:prefix>/revoke/", views.key_revoke, name="revoke"),
]
