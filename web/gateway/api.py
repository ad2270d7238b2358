"""REST API for the gateway's keys: list, create (the secret in the 201 answer only),
each with its usage per deployment that served it (a companion's share on its own row),
revoke. Operators and admins; one's own keys (an admin
sees everyone's)."""

from __future__ import annotations

import dataclasses
from typing import Any

from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from web.deployments.permissions import can_deploy
from web.gateway import selectors, services


class CanHoldKeys(permissions.BasePermission):
    message = "API keys call deployments: that takes the operator or admin role."

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_deploy(request.user)


class ApiKeySerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(read_only=True)
    name = serializers.CharField(max_length=services.MAX_NAME)
    prefix = serializers.CharField(read_only=True)
    owner = serializers.CharField(read_only=True)
    all_deployments = serializers.BooleanField(read_only=True)
    deployments = serializers.ListField(
        child=serializers.IntegerField(min_value=1), required=False, allow_null=True,
        default=None, write_only=True, max_length=1000,
        help_text="deployment ids the key may call; absent or null: all deployments")
    deployment_names = serializers.ListField(child=serializers.CharField(), read_only=True)
    rate_limit_per_minute = serializers.IntegerField(
        min_value=1, max_value=services.MAX_RATE_LIMIT, required=False, allow_null=True,
        default=None)
    created_at = serializers.DateTimeField(read_only=True)
    last_used_at = serializers.DateTimeField(read_only=True)
    revoked_at = serializers.DateTimeField(read_only=True)
    requests = serializers.IntegerField(read_only=True)
    prompt_tokens = serializers.IntegerField(read_only=True)
    completion_tokens = serializers.IntegerField(read_only=True)
    usage = serializers.ListField(
        child=serializers.DictField(), read_only=True,
        help_text="per deployment that served the key's requests: deployment, deployment_id, "
                  "model, companion_of (the deployments it served as their companion), "
                  "requests, prompt_tokens, completion_tokens, last_used_at")


class NewApiKeySerializer(ApiKeySerializer):
    secret = serializers.CharField(read_only=True, help_text="shown in this answer only")


def _as_dict(info: selectors.ApiKeyInfo) -> dict[str, Any]:
    return dataclasses.asdict(info)


KEY_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="the key's id")


class ApiKeyViewSet(viewsets.ViewSet):
    permission_classes = [CanHoldKeys]
    serializer_class = ApiKeySerializer
    lookup_value_regex = r"[0-9]+"

    def _owner(self, request: Request) -> Any:
        return None if request.user.is_superuser else request.user

    def _get(self, request: Request, pk: str | None) -> selectors.ApiKeyInfo:
        info = selectors.apikey_get(key_id=int(pk), owner=self._owner(request)) if (
            pk and pk.isdigit()) else None
        if info is None:
            raise NotFound("No such API key of yours.")
        return info

    def list(self, request: Request) -> Response:
        keys = selectors.apikey_list(owner=self._owner(request))
        return Response(ApiKeySerializer([_as_dict(k) for k in keys], many=True).data)

    @extend_schema(parameters=[KEY_ID])
    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        info = self._get(request, pk)
        return Response(ApiKeySerializer(_as_dict(info)).data)

    @extend_schema(request=ApiKeySerializer, responses={201: NewApiKeySerializer})
    def create(self, request: Request) -> Response:
        body = ApiKeySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            made = services.apikey_create(
                owner_username=request.user.get_username(), name=data["name"],
                deployment_ids=data.get("deployments"),
                rate_limit_per_minute=data.get("rate_limit_per_minute"))
        except services.ApiKeyError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        info = selectors.apikey_get(key_id=made.key.pk)
        assert info is not None
        return Response(NewApiKeySerializer({**_as_dict(info), "secret": made.secret}).data,
                        status=status.HTTP_201_CREATED)

    @extend_schema(request=None, responses={200: ApiKeySerializer}, parameters=[KEY_ID])
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        info = self._get(request, pk)
        services.apikey_revoke(prefix=info.prefix)
        revoked = selectors.apikey_get(key_id=info.id) or info
        return Response(ApiKeySerializer(_as_dict(revoked)).data)
