from django.urls import path

from . import views

app_name = "fleet"
urlpatterns = [
    path("", views.host_list, name="hosts"),
    path("hosts/<slug:name>/drain/", views.host_drain, name="drain"),
    path("hosts/<slug:name>/remove/", views.host_remove, name="remove"),
    path("tokens/", views.jointoken_page, name="tokens"),
    path("tokens/<int:token_id>/revoke/", views.jointoken_revoke, name="revoke"),
]
