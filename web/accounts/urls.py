from django.urls import path

from . import views

app_name = "accounts"
urlpatterns = [
    path("tokens/", views.token_page, name="tokens"),
    path("tokens/<str:key>/revoke/", views.token_revoke, name="revoke"),
]
