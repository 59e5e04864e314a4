"""The environments a booking may launch on its node (issue 22): an admin-kept list of containers (an image and
the command run in it) and, where the admins allow it, plain commands, each with its resource limits.

Only what is listed here can ever run: people pick an environment, they never send a command or an image. The
command is an argument list, never a shell line, checked here when saved and again by the agent before it runs
(gpubook_agent.protocol.argv_problem). In the command, ``{socket}`` stands for a Unix socket in a directory only the
booking's user can enter, ``{port}`` for a free loopback port on the node (for servers that cannot use a socket:
any account on the node can race for it, so the agent shows it only once the launch holds it) and ``{token}`` for a
fresh secret, which the agent picks when it starts the launch (a notebook listens there).

A ``Launch`` is one run of an environment in a booking: asked for by the booking's holder, carried to the node in
the booking's lease (reservations/leases.py), started there once the slot has opened its GPUs and ended with it.
The agent reports its state, output and connection in every heartbeat (environments/services.py).
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from gpubook_agent.protocol import IMAGE_RE, MAX_SOCKET_PATH_CHARS, argv_problem, launch_name
from reservations.models import Reservation


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
        help_text='The command as a list of arguments, never a shell line: ["jupyter", "lab", "--no-browser", '
        '"--ServerApp.sock={socket}"]. {socket}, {port} and {token} are filled in on the node: a Unix socket in a '
        "directory only the booking's user can enter (prefer it: no other account on the node can take or reach it; "
        "a container gets no network), a free port on its loopback (for servers that cannot use a socket; shown only "
        "once the launch is seen holding it) and a fresh secret, shown to the booking's holder alone. The command also "
        "finds them in GPUBOOK_SOCKET, GPUBOOK_PORT and GPUBOOK_TOKEN (and JUPYTER_TOKEN, which Jupyter reads by "
        "itself): prefer those to {token}, since any account on the node can read a command line. With {port} in a "
        "container, listen on 0.0.0.0, the container's own network: the node publishes the port on its loopback only."
    )
    memory_max_gb = models.PositiveIntegerField(
        "memory limit (GB)",
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(16384)],
        help_text="The address space of each process (RLIMIT_AS, the limit nodes without cgroups offer). CUDA reserves "
        "far more address space than it uses: leave it empty for GPU work unless a value was tried.",
    )
    max_processes = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1), MaxValueValidator(1_000_000)],
        help_text="The user's processes on the node (RLIMIT_NPROC), counted across all their sessions.",
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


class Launch(models.Model):
    """One run of an environment in a booking (``gpubook-<reservation>-<number>`` on the node)."""

    class State(models.TextChoices):
        REQUESTED = "requested", "Waiting to start"
        STARTING = "starting", "Starting"
        RUNNING = "running", "Running"
        EXITED = "exited", "Exited"
        STOPPED = "stopped", "Stopped"
        REFUSED = "refused", "Refused by the node"

    # Still to run or running: the node is asked to run it (unless a stop was asked for).
    OPEN_STATES = (State.REQUESTED, State.STARTING, State.RUNNING)

    reservation = models.ForeignKey(Reservation, on_delete=models.CASCADE, related_name="launches")
    number = models.PositiveIntegerField(help_text="1, 2, ... within the booking.")
    environment = models.ForeignKey(Environment, on_delete=models.PROTECT, related_name="launches")
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="+")
    requested_at = models.DateTimeField()
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    stop_requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    state = models.CharField(max_length=16, choices=State.choices, default=State.REQUESTED)
    exit_code = models.IntegerField(null=True, blank=True)
    message = models.TextField(blank=True, help_text="Why it was refused or how it ended, from the node.")
    port = models.PositiveIntegerField(null=True, blank=True, help_text="The node's loopback port it listens on.")
    socket = models.CharField(
        max_length=MAX_SOCKET_PATH_CHARS,
        blank=True,
        help_text="The Unix socket it listens on, on the node, in a directory only its user can enter.",
    )
    token = models.CharField(max_length=128, blank=True, help_text="Its notebook's token: shown only to its holder.")
    log_tail = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    reported_at = models.DateTimeField(null=True, blank=True, help_text="The node's last word on it.")

    class Meta:
        ordering = ["reservation_id", "number"]
        constraints = [models.UniqueConstraint(fields=["reservation", "number"], name="launch_number_unique")]

    def __str__(self) -> str:
        return f"{self.environment} in booking #{self.reservation_id} (launch {self.number})"

    @property
    def is_open(self) -> bool:
        return self.state in self.OPEN_STATES

    @property
    def name(self) -> str:
        """Its name on the node: its container's, its unit's, its log's."""
        return launch_name(self.reservation_id, self.number)
