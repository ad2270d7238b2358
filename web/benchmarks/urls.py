from django.urls import path

from . import tune_views, verification_views, views

app_name = "benchmarks"

urlpatterns = [
    path("", views.benchmark_list, name="list"),
    path("new/", views.benchmark_new, name="new"),
    path("<int:pk>/", views.benchmark_detail, name="detail"),
    path("<int:pk>/cancel/", views.benchmark_cancel, name="cancel"),
    # The losslessness check (a speculative deployment against its baseline).
    path("verifications/", verification_views.verification_list, name="verification-list"),
    path("verifications/new/", verification_views.verification_new, name="verification-new"),
    path("verifications/<int:pk>/", verification_views.verification_detail,
         name="verification-detail"),
    path("verifications/<int:pk>/cancel/", verification_views.verification_cancel,
         name="verification-cancel"),
    # Tune (candidates of one deployment's spec, the fastest lossless one recommended).
    path("tunes/", tune_views.tune_list, name="tune-list"),
    path("tunes/new/", tune_views.tune_new, name="tune-new"),
    path("tunes/<int:pk>/", tune_views.tune_detail, name="tune-detail"),
    path("tunes/<int:pk>/cancel/", tune_views.tune_cancel, name="tune-cancel"),
    path("tunes/<int:pk>/apply/", tune_views.tune_apply, name="tune-apply"),
]
