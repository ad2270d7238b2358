"""REST API for Tune, operators only: create (`POST /api/tunes/` or
`POST /api/deployments/N/tune/`), list (`GET /api/deployments/N/tune/` a deployment's),
detail, cancel, apply, export (JSON, CSV)."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action, api_view, permission_classes
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from appliance.bench.lossless import NEAR_TIE_GAP
from web.deployments.permissions import can_deploy

from . import tune_applying, tune_task
from . import tune_selectors as selectors
from . import tune_services as services
from .services import BenchmarkInputError
from .tune_models import TuneRun


class TuneRunSerializer(serializers.ModelSerializer[TuneRun]):
    recommended = serializers.SerializerMethodField()
    hold = serializers.SerializerMethodField()

    class Meta:
        model = TuneRun
        fields = ["id", "name", "status", "deployment", "original", "config", "progress",
                  "results", "recommended", "applied", "hold", "error", "created_at",
                  "started_at", "finished_at"]
        read_only_fields = fields

    def get_recommended(self, run: TuneRun) -> str | None:
        return tune_applying.recommended(run)

    def get_hold(self, run: TuneRun) -> dict[str, Any] | None:
        """While it runs: the deployment is out of service, and until when at the latest."""
        if not run.is_active or run.deployment_id is None:
            return None
        hold = tune_task.tune_hold(deployment_id=run.deployment_id)
        return hold if hold and hold.get("tune") == run.pk else None


class CandidateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=40)
    engine = serializers.DictField(help_text="engine options changed on the deployment's spec, "
                                   "e.g. {\"speculative_num_draft_tokens\": 16}")


class TuneCreateSerializer(serializers.Serializer[Any]):
    deployment = serializers.IntegerField(min_value=1, max_value=2**63 - 1, required=False,
                                          help_text="a ready deployment (replica 0)")
    name = serializers.CharField(required=False, default="", max_length=100, allow_blank=True)
    levels = serializers.ListField(child=serializers.IntegerField(min_value=1, max_value=1024),
                                   min_length=1, max_length=services.MAX_LEVELS,
                                   default=services.DEFAULTS["levels"])
    prompt_source = serializers.ChoiceField(choices=services.PROMPT_SOURCES,
                                            default="builtin", help_text="builtin: the "
                                            "shipped set; jsonl or sharegpt: `prompts`")
    prompts = serializers.CharField(required=False, default="", allow_blank=True,
                                    help_text="JSONL of prompts or a ShareGPT JSON document")
    num_prompts = serializers.IntegerField(min_value=1, max_value=1000, default=32)
    input_len = serializers.IntegerField(min_value=1, max_value=32768, default=256)
    output_len = serializers.IntegerField(min_value=1, max_value=4096, default=128)
    warmup = serializers.IntegerField(min_value=0, max_value=16, default=2)
    seed = serializers.IntegerField(min_value=0, max_value=2**31 - 1, default=0)
    time_budget_s = serializers.IntegerField(min_value=60, max_value=86400, default=3600,
                                             help_text="the whole Tune's time; spent, it "
                                             "stops and restores the deployment")
    deploy_timeout_s = serializers.IntegerField(min_value=30, max_value=7200, default=1800)
    lossless_prompts = serializers.IntegerField(min_value=1, max_value=64, default=8)
    lossless_max_tokens = serializers.IntegerField(min_value=1, max_value=512, default=32)
    threshold = serializers.FloatField(min_value=0, max_value=100, default=NEAR_TIE_GAP)
    placement = serializers.ChoiceField(
        choices=services.PLACEMENTS, default="in_place", help_text="in_place: on the "
        "deployment's own GPUs (replica 0's), out of service meanwhile; side_by_side: on free "
        "GPUs of the same kind on its host, as a deployment of their own, while it serves on")
    candidates = serializers.ListField(
        child=serializers.CharField(max_length=40), required=False, default=list,
        help_text="default candidates to run (none, dflash, ddtree-8, ddtree-16, ddtree-32; "
        "empty: all); the baseline `none` always runs")
    extra_candidates = CandidateSerializer(many=True, required=False, default=list)

    CONFIG = ("levels", "prompt_source", "num_prompts", "input_len", "output_len", "warmup",
              "seed", "time_budget_s", "deploy_timeout_s", "lossless_prompts",
              "lossless_max_tokens", "threshold", "placement")

    def config(self) -> dict[str, Any]:
        return {k: self.validated_data[k] for k in self.CONFIG}


class IsOperator(permissions.BasePermission):
    message = "Tune is for operators: it takes a deployment out of service while it runs."

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_deploy(request.user)


def create_from(body: TuneCreateSerializer, user: Any, deployment_id: int | None) -> TuneRun:
    data = body.validated_data
    try:
        return services.tune_create(
            deployment_id=deployment_id if deployment_id is not None else data.get(
                "deployment"), config=body.config(), prompts_text=data["prompts"],
            candidates=data["candidates"] or None,
            extra_candidates=[dict(c) for c in data["extra_candidates"]] or None,
            name=data["name"], user=user)
    except BenchmarkInputError as exc:
        raise ValidationError({k: [v] for k, v in exc.errors.items()}) from exc


class ApplySerializer(serializers.Serializer[Any]):
    candidate = serializers.CharField(required=False, allow_blank=True, default="",
                                      help_text="default: the recommended candidate")


class TuneViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                  viewsets.GenericViewSet[TuneRun]):
    serializer_class = TuneRunSerializer
    permission_classes = [permissions.IsAuthenticated, IsOperator]

    def get_queryset(self) -> Any:
        return selectors.tune_list()

    @extend_schema(request=TuneCreateSerializer, responses={201: TuneRunSerializer})
    def create(self, request: Request) -> Response:
        body = TuneCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        if body.validated_data.get("deployment") is None:
            raise ValidationError({"deployment": ["the id of the deployment to tune"]})
        run = create_from(body, request.user, None)
        return Response(TuneRunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: TuneRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = services.tune_request_cancel(run=self.get_object())
        return Response(TuneRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ApplySerializer, responses={202: TuneRunSerializer})
    @action(detail=True, methods=["post"])
    def apply(self, request: Request, pk: str | None = None) -> Response:
        body = ApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            run = tune_applying.tune_apply(run=self.get_object(),
                                      candidate=body.validated_data["candidate"] or None,
                                      user=request.user)
        except BenchmarkInputError as exc:
            raise ValidationError({k: [v] for k, v in exc.errors.items()}) from exc
        return Response(TuneRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: OpenApiResponse(description="one row per candidate and "
                                                   "level")})
    @action(detail=True, methods=["get"], url_path="export.csv")
    def export_csv(self, request: Request, pk: str | None = None) -> HttpResponse:
        run = self.get_object()
        response = HttpResponse(selectors.tune_csv(run=run), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="tune-{run.pk}.csv"'
        return response

    @extend_schema(responses={200: TuneRunSerializer})
    @action(detail=True, methods=["get"], url_path="export.json",
            renderer_classes=[JSONRenderer])
    def export_json(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        response = Response(TuneRunSerializer(run).data)
        response["Content-Disposition"] = f'attachment; filename="tune-{run.pk}.json"'
        return response


@extend_schema(methods=["GET"], responses={200: TuneRunSerializer(many=True)})
@extend_schema(methods=["POST"], request=TuneCreateSerializer,
               responses={201: TuneRunSerializer})
@api_view(["GET", "POST"])
@permission_classes([permissions.IsAuthenticated, IsOperator])
def deployment_tune(request: Request, pk: int) -> Response:
    """A deployment's Tunes (newest first), or a new Tune of it."""
    if request.method == "POST":
        body = TuneCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = create_from(body, request.user, pk)
        return Response(TuneRunSerializer(run).data, status=status.HTTP_201_CREATED)
    runs = selectors.tune_list().filter(deployment_id=pk)[:50]
    return Response(TuneRunSerializer(runs, many=True).data)
