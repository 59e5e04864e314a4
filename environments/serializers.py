"""What the environments API takes and gives."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from environments.booking_part import local_url, tunnel_command
from environments.models import Environment, Launch


class EnvironmentSerializer(serializers.ModelSerializer):
    class Meta:
        model = Environment
        fields = ("id", "name", "kind", "image", "command", "memory_max_gb", "max_processes", "description")
        read_only_fields = fields


class LaunchInput(serializers.Serializer):
    reservation = serializers.IntegerField(min_value=1, max_value=2**62, help_text="Your booking's id.")
    environment = serializers.IntegerField(
        min_value=1, max_value=2**62, help_text="An environment's id (GET /api/v1/environments/)."
    )


class LaunchSerializer(serializers.ModelSerializer):
    environment_name = serializers.CharField(source="environment.name", read_only=True)
    node = serializers.CharField(source="reservation.node.name", read_only=True)
    state_label = serializers.CharField(source="get_state_display", read_only=True)
    stop_requested = serializers.SerializerMethodField()
    token = serializers.SerializerMethodField()
    ssh_tunnel = serializers.SerializerMethodField()
    local_url = serializers.SerializerMethodField()

    class Meta:
        model = Launch
        fields = (
            "id",
            "reservation",
            "number",
            "environment",
            "environment_name",
            "node",
            "state",
            "state_label",
            "requested_at",
            "started_at",
            "ended_at",
            "exit_code",
            "message",
            "stop_requested",
            "port",
            "socket",
            "token",
            "ssh_tunnel",
            "local_url",
            "log_tail",
        )
        read_only_fields = fields

    def get_stop_requested(self, launch: Launch) -> bool:
        return launch.stop_requested_at is not None

    @extend_schema_field(serializers.CharField(help_text="The notebook's token: only its booking's holder sees it."))
    def get_token(self, launch: Launch) -> str:
        viewer: Any = self.context["request"].user
        return launch.token if launch.reservation.user_id == viewer.pk else ""

    @extend_schema_field(
        serializers.CharField(
            help_text="While it runs and the node has seen it listen on its Unix socket or port: the SSH tunnel that "
            "reaches it, from your computer."
        )
    )
    def get_ssh_tunnel(self, launch: Launch) -> str:
        return tunnel_command(launch)

    @extend_schema_field(serializers.CharField(help_text="With ssh_tunnel running: the address to browse to."))
    def get_local_url(self, launch: Launch) -> str:
        return local_url(launch)
