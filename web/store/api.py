"""REST API of the model store: list, detail (with files), add from a hub, cancel, scan."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from web.deployments.permissions import can_deploy, can_view

from . import selectors, services
from .models import ModelEntry, ModelFile, ModelState


class ModelFileSerializer(serializers.ModelSerializer[ModelFile]):
    class Meta:
        model = ModelFile
        fields = ["path", "size_bytes", "bytes_done", "state", "sha256_expected",
                  "sha256_actual", "error"]
        read_only_fields = fields


class ModelEntrySerializer(serializers.ModelSerializer[ModelEntry]):
    engine_path = serializers.CharField(read_only=True)
    usable = serializers.BooleanField(source="is_usable", read_only=True)
    rate_bps = serializers.SerializerMethodField()
    seconds_left = serializers.SerializerMethodField()
    waiting = serializers.SerializerMethodField()
    deployments = serializers.SerializerMethodField()

    class Meta:
        model = ModelEntry
        fields = ["id", "root", "relative_path", "engine_path", "source", "repo_id", "revision",
                  "commit", "kind", "state", "usable", "error", "size_bytes", "bytes_done",
                  "file_count", "rate_bps", "seconds_left", "waiting", "config", "deployments",
                  "cancel_requested", "created_at", "started_at", "finished_at", "verified_at"]
        read_only_fields = fields

    def get_rate_bps(self, entry: ModelEntry) -> float:
        """The job's last rate while a job holds the entry; 0 once none does (a dead
        worker's last figure would read as a download going on)."""
        live = entry.lease_until is not None and entry.lease_until > timezone.now()
        return round(entry.rate_bps, 1) if live and entry.is_active else 0.0

    def get_seconds_left(self, entry: ModelEntry) -> float | None:
        rate = self.get_rate_bps(entry)
        if entry.state != ModelState.DOWNLOADING or rate <= 0:
            return None
        return round(max(entry.size_bytes - entry.bytes_done, 0) / rate, 1)

    def get_waiting(self, entry: ModelEntry) -> bool:
        """Active with no job holding it: queued, or its worker died (resumed at the next
        worker start)."""
        return entry.is_active and (entry.lease_until is None
                                    or entry.lease_until <= timezone.now())

    def get_deployments(self, entry: ModelEntry) -> list[dict[str, Any]]:
        return [{"id": d.pk, "name": d.name, "status": d.status}
                for d in selectors.model_entry_deployments(entry=entry)]


class ModelEntryDetailSerializer(ModelEntrySerializer):
    files = ModelFileSerializer(many=True, read_only=True)

    class Meta(ModelEntrySerializer.Meta):
        fields = [*ModelEntrySerializer.Meta.fields, "files"]
        read_only_fields = fields


class ModelAddSerializer(serializers.Serializer[Any]):
    repo_id = serializers.CharField(max_length=200, help_text="a hub repository, org/name")
    revision = serializers.CharField(max_length=200, default="main",
                                     help_text="a branch, tag or commit")
    # Named as the setting names it; DRF's Field.root (the top serializer) is not used here.
    root = serializers.CharField(  # type: ignore[assignment]
        max_length=500, required=False, allow_blank=True,
        help_text="one of APPLIANCE_MODEL_ROOTS; default the first")
    path = serializers.CharField(max_length=500, required=False, allow_blank=True,
                                 help_text="the folder below the root; default the repo id")


def entry_add(data: dict[str, Any]) -> ModelEntry:
    """The add request of the API and the panel's form: errors keyed by field."""
    body = ModelAddSerializer(data=data)
    body.is_valid(raise_exception=True)
    values = body.validated_data
    try:
        return services.model_download_request(
            repo_id=values["repo_id"], revision=values["revision"],
            root=values.get("root") or None, relative_path=values.get("path") or None)
    except services.StoreInputError as exc:
        raise ValidationError({k: [v] for k, v in exc.errors.items()}) from exc


class CanUseStore(permissions.BasePermission):
    message = "You need the viewer role to read the model store, the operator role to add, " \
              "cancel or scan."

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return can_view(request.user)
        return can_deploy(request.user)


class ModelEntryViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin,
                        viewsets.GenericViewSet[ModelEntry]):
    permission_classes = [permissions.IsAuthenticated, CanUseStore]

    def get_serializer_class(self) -> Any:
        return ModelEntryDetailSerializer if self.action == "retrieve" else ModelEntrySerializer

    def get_queryset(self) -> Any:
        wanted = self.request.query_params.get("state")
        if wanted and wanted not in ModelState.values:
            raise ValidationError({"state": [
                f"Unknown state; use one of: {', '.join(ModelState.values)}."]})
        return selectors.model_entries_list(state=wanted).prefetch_related("files")

    @extend_schema(request=ModelAddSerializer, responses={202: ModelEntrySerializer})
    def create(self, request: Request) -> Response:
        """Add a model from the hub: a download job on the models queue."""
        if not isinstance(request.data, dict):
            raise ValidationError({"": ["send a JSON object: {repo_id, revision, root, path}"]})
        entry = entry_add(request.data)
        return Response(ModelEntrySerializer(entry).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: ModelEntrySerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str | None = None) -> Response:
        entry = services.model_download_cancel(entry_id=self.get_object().pk)
        return Response(ModelEntrySerializer(entry).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: ModelEntrySerializer(many=True)})
    @action(detail=False, methods=["post"])
    def scan(self, request: Request) -> Response:
        """Look through every root now: folders copied by hand become entries."""
        entries = services.model_store_scan()
        return Response(ModelEntrySerializer(entries, many=True).data)
