"""The environments a booking may launch on its node (issue 22): an admin-kept list of containers (an image and
the command run in it) and, where the admins allow it, plain commands, each with its resource limits.

Only what is listed here can ever run: people pick an environment, they never send a command or an image. The
command is an argument list, never a shell line, checked here when saved and again by the agent before it runs
(gpubook_agent.protocol.argv_problem). Launching from a booking comes in issue 22's next steps.
"""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from gpubook_agent.protocol import argv_problem

# An OCI image reference: [registry[:port]/]path[:tag][@sha256:digest], lower case path components.
IMAGE_RE = re.compile(
    r"\A(?:[a-z0-9]+(?:[.-][a-z0-9]+)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[a-f0-9]{64})?\Z"
)


class Environment(models.Model):
    class Kind(models.TextChoices):
        CONTAINER = "container", "Container (rootless podman)"
        COMMAND = "command", "Plain command on the node"

    name = models.CharField(max_length=64, unique=True, help_text='What people pick, e.g. "PyTorch 2.5, CUDA 12.4".')
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.CONTAINER)
    image = models.CharField(
        max_length=255,
        blank=True,
        help_text="Containers: the image, e.g. registry.example.org/lab/pytorch:2.5-cuda12.4 (nodes pull it ahead "
        "of the slot). Empty for a plain command.",
    )
    command = models.JSONField(
        help_text='The command as a list of arguments, never a shell line: ["jupyter", "lab", "--no-browser"].'
    )
    memory_max_gb = models.PositiveIntegerField(
        "memory limit (GB)", null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(16384)]
    )
    max_processes = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1), MaxValueValidator(1_000_000)]
    )
    description = models.TextField(blank=True, help_text="Shown to people choosing an environment.")
    enabled = models.BooleanField(default=True, help_text="Only enabled environments can be launched.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        problem = argv_problem(self.command)
        if problem:
            raise ValidationError({"command": f"Not a command the nodes run: {problem}."})
        if self.kind == self.Kind.CONTAINER and not IMAGE_RE.match(self.image):
            raise ValidationError(
                {"image": "Give the container's image, like registry.example.org/lab/pytorch:2.5 (lower case path)."}
            )
        if self.kind == self.Kind.COMMAND and self.image:
            raise ValidationError({"image": "A plain command runs no image: leave it empty, or make it a container."})
