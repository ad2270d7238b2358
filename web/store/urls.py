from django.urls import path

from . import sse, views

app_name = "store"

urlpatterns = [
    path("", views.model_list, name="list"),
    path("scan/", views.model_scan, name="scan"),
    path("<int:pk>/", views.model_detail, name="detail"),
    path("<int:pk>/cancel/", views.model_cancel, name="cancel"),
    path("<int:pk>/events", sse.model_entry_stream, name="events"),
]
