"""REST API for people: join tokens (admins: list, create with the secret in the 201 answer
only, revoke) and hosts (viewers list and read; admins drain, undrain and remove)."""

from __future__ import annotations

import dataclasses
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from . import selectors, services
from .models import JoinToken
from .permissions import can_manage_fleet, can_view_fleet


class CanManageFleet(permissions.BasePermission):
    message = "Join tokens and changes to hosts are an admin's."

    def has_permission(self, request: Request, view: Any) -> bool:
        return can_manage_fleet(request.user)


class CanReadFleet(permissions.BasePermission):
    message = ("You need the viewer role to see hosts; draining and removing a host is an "
               "admin's.")

    def has_permission(self, request: Request, view: Any) -> bool:
        if request.method in permissions.SAFE_METHODS:
            return can_view_fleet(request.user)
        return can_manage_fleet(request.user)


class JoinTokenSerializer(serializers.Serializer[Any]):
    id = serializers.IntegerField(read_only=True)
    host_name = serializers.CharField(max_length=63, help_text="the host it lets join")
    ttl_hours = serializers.IntegerField(
        min_value=1, max_value=services.TOKEN_TTL_MAX_H, default=services.TOKEN_TTL_DEFAULT_H,
        write_only=True, help_text="how long it can be used")
    prefix = serializers.CharField(read_only=True)
    state = serializers.CharField(read_only=True, help_text="usable, expired or revoked")
    created_by = serializers.CharField(read_only=True, allow_null=True)
    created_at = serializers.DateTimeField(read_only=True)
    expires_at = serializers.DateTimeField(read_only=True)
    revoked_at = serializers.DateTimeField(read_only=True)
    used_by = serializers.CharField(read_only=True)
    first_used_at = serializers.DateTimeField(read_only=True)
    last_used_at = serializers.DateTimeField(read_only=True)
    uses = serializers.IntegerField(read_only=True)


class NewJoinTokenSerializer(JoinTokenSerializer):
    secret = serializers.CharField(read_only=True, help_text="shown in this answer only")


def token_data(token: JoinToken) -> dict[str, Any]:
    return {"id": token.pk, "host_name": token.host_name, "prefix": f"sdj-{token.prefix}",
            "state": selectors.jointoken_state(token=token, now=timezone.now()),
            "created_by": token.created_by.get_username() if token.created_by else None,
            "created_at": token.created_at, "expires_at": token.expires_at,
            "revoked_at": token.revoked_at, "used_by": token.used_by,
            "first_used_at": token.first_used_at, "last_used_at": token.last_used_at,
            "uses": token.uses}


TOKEN_ID = OpenApiParameter("id", int, OpenApiParameter.PATH, description="the token's id")


class JoinTokenViewSet(viewsets.ViewSet):
    permission_classes = [permissions.IsAuthenticated, CanManageFleet]
    serializer_class = JoinTokenSerializer
    lookup_value_regex = r"[0-9]+"

    def list(self, request: Request) -> Response:
        tokens = [token_data(t) for t in selectors.jointoken_list()]
        return Response(JoinTokenSerializer(tokens, many=True).data)

    @extend_schema(request=JoinTokenSerializer, responses={201: NewJoinTokenSerializer})
    def create(self, request: Request) -> Response:
        body = JoinTokenSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            made = services.jointoken_create(host_name=body.validated_data["host_name"],
                                             ttl_hours=body.validated_data["ttl_hours"],
                                             created_by=request.user)
        except services.FleetError as exc:
            raise ValidationError({exc.field: [str(exc)]}) from exc
        data = {**token_data(made.token), "secret": made.secret}
        return Response(NewJoinTokenSerializer(data).data, status=status.HTTP_201_CREATED)

    @extend_schema(parameters=[TOKEN_ID])
    def retrieve(self, request: Request, pk: str | None = None) -> Response:
        return Response(JoinTokenSerializer(token_data(self._get(pk))).data)

    @extend_schema(request=None, responses={200: JoinTokenSerializer}, parameters=[TOKEN_ID])
    @action(detail=True, methods=["post"])
    def revoke(self, request: Request, pk: str | None = None) -> Response:
        token = self._get(pk)
        services.jointoken_revoke(token_id=token.pk)
        return Response(JoinTokenSerializer(token_data(self._get(pk))).data)

    def _get(self, pk: str | None) -> JoinToken:
        token = JoinToken.objects.filter(pk=int(pk)).first() if pk and pk.isdigit() else None
        if token is None:
            raise NotFound("No such join token.")
        return token


class HostSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(read_only=True)
    joined = serializers.BooleanField(read_only=True,
                                      help_text="false: the panel's own host")
    state = serializers.CharField(read_only=True, help_text="ready, draining or lost")
    draining = serializers.BooleanField(read_only=True)
    agent_version = serializers.CharField(read_only=True)
    gpus = serializers.ListField(child=serializers.DictField(), read_only=True)
    gpu_source = serializers.CharField(read_only=True, help_text="nvml or count")
    docker = serializers.DictField(read_only=True)
    heartbeat_at = serializers.DateTimeField(read_only=True, allow_null=True)
    heartbeat_age_s = serializers.FloatField(read_only=True, allow_null=True)
    joined_at = serializers.DateTimeField(read_only=True, allow_null=True)
    credential_prefix = serializers.CharField(read_only=True)
    credential_last_used_at = serializers.DateTimeField(read_only=True, allow_null=True)
    deployments = serializers.ListField(child=serializers.IntegerField(), read_only=True,
                                        help_text="placed here or holding GPUs here")
    held_gpus = serializers.ListField(child=serializers.IntegerField(), read_only=True,
                                      help_text="GPU indexes leased to a deployment")
    free_gpus = serializers.IntegerField(read_only=True)


def _row_data(row: selectors.HostRow) -> dict[str, Any]:
    return {**dataclasses.asdict(row), "free_gpus": row.free_gpus}


HOST_NAME = OpenApiParameter("name", str, OpenApiParameter.PATH, description="the host's name")


class HostViewSet(viewsets.ViewSet):
    permission_classes = [permissions.IsAuthenticated, CanReadFleet]
    serializer_class = HostSerializer
    lookup_field = "name"
    lookup_value_regex = r"[a-z0-9-]{1,63}"

    def list(self, request: Request) -> Response:
        rows = [_row_data(r) for r in selectors.host_rows()]
        return Response(HostSerializer(rows, many=True).data)

    @extend_schema(parameters=[HOST_NAME])
    def retrieve(self, request: Request, name: str | None = None) -> Response:
        return Response(HostSerializer(_row_data(self._row(name))).data)

    @extend_schema(request=None, responses={200: HostSerializer}, parameters=[HOST_NAME])
    @action(detail=True, methods=["post"])
    def drain(self, request: Request, name: str | None = None) -> Response:
        return self._set_draining(name, True)

    @extend_schema(request=None, responses={200: HostSerializer}, parameters=[HOST_NAME])
    @action(detail=True, methods=["post"])
    def undrain(self, request: Request, name: str | None = None) -> Response:
        return self._set_draining(name, False)

    @extend_schema(parameters=[HOST_NAME], responses={204: None})
    def destroy(self, request: Request, name: str | None = None) -> Response:
        try:
            services.host_remove(name=str(name))
        except services.NoSuchHost as exc:
            raise NotFound(str(exc)) from exc
        except services.FleetError as exc:  # engines still run there: the message names them
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _set_draining(self, name: str | None, draining: bool) -> Response:
        try:
            services.host_set_draining(name=str(name), draining=draining)
        except services.NoSuchHost as exc:
            raise NotFound(str(exc)) from exc
        return Response(HostSerializer(_row_data(self._row(name))).data)

    def _row(self, name: str | None) -> selectors.HostRow:
        row = next((r for r in selectors.host_rows() if r.name == name), None)
        if row is None:
            raise NotFound(f"No host {name!r}.")
        return row
