"""REST API for benchmark runs: create, list, detail, cancel, export (JSON, CSV)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.bench.prompts import SOURCES
from appliance.bench.runner import DEFAULT_LEVELS, MODES
from web.deployments.permissions import can_deploy, can_view

from . import selectors, services
from .models import BenchmarkRun


class BenchmarkRunSerializer(serializers.ModelSerializer[BenchmarkRun]):
    deployments = serializers.PrimaryKeyRelatedField(  # type: ignore[var-annotated]
        many=True, read_only=True)

    class Meta:
        model = BenchmarkRun
        fields = ["id", "name", "status", "config", "targets", "deployments", "progress",
                  "results", "error", "failed_requests", "created_at", "started_at", "finished_at"]
        read_only_fields = fields


class BenchmarkCreateSerializer(serializers.Serializer[Any]):
    deployments = serializers.ListField(child=serializers.IntegerField(), min_length=1,
                                        max_length=3)
    baseline = serializers.IntegerField(required=False, help_text="a deployment id; "
                                        "default: the last of `deployments`")
    name = serializers.CharField(required=False, default="", max_length=100, allow_blank=True)
    levels = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=1024),
                                   min_length=1, max_length=16, default=list(DEFAULT_LEVELS))
    num_prompts = serializers.IntegerField(min_value=1, max_value=10000, default=64)
    input_len = serializers.IntegerField(min_value=1, max_value=131072, default=512)
    output_len = serializers.IntegerField(min_value=1, max_value=131072, default=256)
    prompt_source = serializers.ChoiceField(choices=SOURCES, default="synthetic")
    prompts = serializers.CharField(required=False, default="", allow_blank=True,
                                    help_text="JSONL of prompts or a ShareGPT JSON document")
    mode = serializers.ChoiceField(choices=MODES, default="back_to_back")
    warmup = serializers.IntegerField(min_value=0, max_value=64, default=1)
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0)
    request_rate = serializers.FloatField(required=False, allow_null=True, default=None,
                                          min_value=0.001)
    per_replica = serializers.BooleanField(
        required=False, default=False, help_text="one deployment with replicas: through the "
        "gateway (its aggregate, the baseline) and each ready replica alone")
    through_gateway = serializers.BooleanField(
        required=False, default=False, help_text="one deployment through the gateway alone, "
        "as its clients call it (a key of the run's own)")

    def config(self) -> dict[str, Any]:
        data = self.validated_data
        keys = ("num_prompts", "input_len", "output_len", "prompt_source", "mode", "warmup",
                "seed", "request_rate")
        return {"levels": sorted(set(data["levels"])), **{k: data[k] for k in keys}}


class CanBenchmark(permissions.BasePermission):
    message = "You need the viewer role to read benchmarks, the operator role to run them."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return can_view(request.user)
        return can_deploy(request.user)


def create_from(body: BenchmarkCreateSerializer, user: Any) -> BenchmarkRun:
    data = body.validated_data
    try:
        return services.benchmark_create(
            deployment_ids=data["deployments"], config=body.config(),
            prompts_text=data["prompts"], baseline_id=data.get("baseline"),
            name=data["name"], user=user, per_replica=data["per_replica"],
            through_gateway=data["through_gateway"])
    except services.BenchmarkInputError as exc:
        raise ValidationError({k: [v] for k, v in exc.errors.items()}) from exc


class BenchmarkViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                       viewsets.GenericViewSet[BenchmarkRun]):
    serializer_class = BenchmarkRunSerializer
    permission_classes = [permissions.IsAuthenticated, CanBenchmark]

    def get_queryset(self) -> Any:
        return selectors.benchmark_list()

    @extend_schema(request=BenchmarkCreateSerializer, responses={201: BenchmarkRunSerializer})
    def create(self, request: Request) -> Response:
        body = BenchmarkCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = create_from(body, request.user)
        return Response(BenchmarkRunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: BenchmarkRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = services.benchmark_request_cancel(run=self.get_object())
        return Response(BenchmarkRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: OpenApiResponse(description="the results as CSV, one row "
                                                   "per deployment and level")})
    @action(detail=True, methods=["get"], url_path="export.csv")
    def export_csv(self, request: Request, pk: str | None = None) -> HttpResponse:
        run = self.get_object()
        response = HttpResponse(selectors.benchmark_csv(run=run), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="benchmark-{run.pk}.csv"'
        return response

    @extend_schema(responses={200: BenchmarkRunSerializer})
    # JSON whatever the Accept: a browser following the page's link gets the file, not
    # the browsable API's HTML page saved under a .json name.
    @action(detail=True, methods=["get"], url_path="export.json",
            renderer_classes=[JSONRenderer])
    def export_json(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        response = Response(BenchmarkRunSerializer(run).data)
        response["Content-Disposition"] = f'attachment; filename="benchmark-{run.pk}.json"'
        return response
