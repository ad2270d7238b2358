"""REST API for losslessness checks: create, list, detail, cancel, export (JSON, CSV)."""

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

from appliance.bench.lossless import NEAR_TIE_GAP

from . import verification_selectors as selectors
from . import verification_services as services
from .api import CanBenchmark
from .services import BenchmarkInputError
from .verification_models import VerificationRun


class VerificationRunSerializer(serializers.ModelSerializer[VerificationRun]):
    class Meta:
        model = VerificationRun
        fields = ["id", "name", "status", "config", "candidate", "baseline", "targets",
                  "progress", "results", "error", "created_at", "started_at", "finished_at"]
        read_only_fields = fields


class VerificationCreateSerializer(serializers.Serializer[Any]):
    # Bounded to the id column's range: a larger number is a 400, not a database error.
    candidate = serializers.IntegerField(min_value=1, max_value=2**63 - 1,
                                         help_text="the speculative deployment's id (ready)")
    baseline = serializers.IntegerField(min_value=1, max_value=2**63 - 1,
                                        help_text="a ready deployment of the same target model "
                                        "without speculation: its top-2 log-probs judge")
    name = serializers.CharField(required=False, default="", max_length=100, allow_blank=True)
    prompt_source = serializers.ChoiceField(choices=services.PROMPT_SOURCES, default="builtin",
                                            help_text="builtin: the shipped set "
                                            "(appliance/bench/data); jsonl: `prompts`")
    prompts = serializers.CharField(required=False, default="", allow_blank=True,
                                    help_text='JSONL, one {"prompt": "..."} a line')
    max_tokens = serializers.IntegerField(min_value=1, max_value=services.MAX_TOKENS,
                                          default=services.DEFAULT_MAX_TOKENS)
    route = serializers.ChoiceField(
        choices=services.ROUTES, default="direct",
        help_text="direct: each engine's own /generate, token ids compared; gateway: the "
        "panel's /v1 by served model name as a client calls it (token texts compared), "
        "with a key the check makes for the caller, scoped to the two and revoked after")
    threshold = serializers.FloatField(min_value=0, max_value=services.MAX_THRESHOLD,
                                       default=NEAR_TIE_GAP,
                                       help_text="B's top-2 log-prob gap at or under which a "
                                       "divergence is a near-tie, above it a failure")


def create_from(body: VerificationCreateSerializer, user: Any) -> VerificationRun:
    data = body.validated_data
    try:
        return services.verification_create(
            candidate_id=data["candidate"], baseline_id=data["baseline"],
            prompt_source=data["prompt_source"], prompts_text=data["prompts"],
            max_tokens=data["max_tokens"], threshold=data["threshold"], route=data["route"],
            name=data["name"], user=user)
    except BenchmarkInputError as exc:
        raise ValidationError({k: [v] for k, v in exc.errors.items()}) from exc


class VerificationViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                          viewsets.GenericViewSet[VerificationRun]):
    serializer_class = VerificationRunSerializer
    permission_classes = [permissions.IsAuthenticated, CanBenchmark]

    def get_queryset(self) -> Any:
        return selectors.verification_list()

    @extend_schema(request=VerificationCreateSerializer,
                   responses={201: VerificationRunSerializer})
    def create(self, request: Request) -> Response:
        body = VerificationCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        run = create_from(body, request.user)
        return Response(VerificationRunSerializer(run).data, status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={202: VerificationRunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        run = services.verification_request_cancel(run=self.get_object())
        return Response(VerificationRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: OpenApiResponse(description="one row per prompt: verdict, "
                                                   "first divergent token, B's top-2 gap, "
                                                   "both continuations")})
    @action(detail=True, methods=["get"], url_path="export.csv")
    def export_csv(self, request: Request, pk: str | None = None) -> HttpResponse:
        run = self.get_object()
        response = HttpResponse(selectors.verification_csv(run=run), content_type="text/csv")
        response["Content-Disposition"] = f'attachment; filename="verification-{run.pk}.csv"'
        return response

    @extend_schema(responses={200: VerificationRunSerializer})
    # JSON whatever the Accept: a browser following the page's link gets the file, not
    # the browsable API's HTML page saved under a .json name.
    @action(detail=True, methods=["get"], url_path="export.json",
            renderer_classes=[JSONRenderer])
    def export_json(self, request: Request, pk: str | None = None) -> Response:
        run = self.get_object()
        response = Response(VerificationRunSerializer(run).data)
        response["Content-Disposition"] = f'attachment; filename="verification-{run.pk}.json"'
        return response
