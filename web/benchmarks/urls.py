from django.urls import path

from . import views

app_name = "benchmarks"

urlpatterns = [
    path("", views.benchmark_list, name="list"),
    path("new/", views.benchmark_new, name="new"),
    path("<int:pk>/", views.benchmark_detail, name="detail"),
    path("<int:pk>/cancel/", views.benchmark_cancel, name="cancel"),
]
