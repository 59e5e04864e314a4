"""What the portal needs of a Slurm cluster's controller, whichever way it talks to it (issue 23): ``scontrol``
over a configured command (slurm/scontrol.py) or slurmrestd's REST API (slurm/rest.py). Both answer with the
dataclasses of slurm/scontrol.py and raise SlurmError with Slurm's own words.

What a cluster can do depends on its Slurm release (``Capabilities``), read at the start of each pass: a cluster
upgraded under the portal is picked up without a restart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # slurm/scontrol.py imports this module
    from slurm.scontrol import SlurmNode, SlurmReservation

# Releases are year.month: 22.05, 23.02, 23.11, 24.05, 24.11, 25.05 ...
VERSION_RE = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
# The first release whose reservations take TRES=gres/gpu=<n> ("Make it so reservations can reserve GRES",
# CHANGELOG/slurm-23.11.md; 23.02 still refuses), and the first that reserves a GPU type alone
# (gres/gpu:<type>=<n>; before it the untyped count had to be given too: CHANGELOG/slurm-25.05.md). docs/slurm.md.
GPU_RESERVATIONS_FROM = (23, 11)
TYPED_GPU_RESERVATIONS_FROM = (25, 5)


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``slurm 22.05.8`` (scontrol --version), ``22.05.8``, or slurmrestd's ``{"major": ...}`` made text by the
    caller: (22, 5, 8); None when there is no version in it."""
    found = VERSION_RE.search(text)
    if found is None:
        return None
    return int(found.group(1)), int(found.group(2)), int(found.group(3) or 0)


@dataclass(frozen=True)
class Capabilities:
    version: tuple[int, int, int]
    api: str  # "scontrol" or "rest"

    @property
    def gpu_reservations(self) -> bool:
        """Whether a reservation can hold some of a node's GPUs (``TRES=gres/gpu:<type>=<n>``) rather than the
        whole node."""
        return self.version[:2] >= GPU_RESERVATIONS_FROM

    @property
    def typed_gpu_reservations(self) -> bool:
        """Whether ``TRES=gres/gpu:<type>=<n>`` alone reserves GPUs of that type; before, the untyped count."""
        return self.version[:2] >= TYPED_GPU_RESERVATIONS_FROM

    @property
    def version_text(self) -> str:
        major, minor, micro = self.version
        return f"{major}.{minor:02d}.{micro}"


@dataclass(frozen=True)
class SlurmJob:
    """One job as accounting (``sacct``) knows it: enough to count the GPU-hours used in a reservation."""

    job_id: str
    user: str
    reservation: str  # "" when the job ran outside any reservation
    start: datetime
    end: datetime | None  # None while it runs
    gpus: int  # GPUs allocated to it (AllocTRES gres/gpu=N); 0 when it asked for none
    nodes: str


class Controller(Protocol):
    """A cluster's controller. Every method raises SlurmError when the controller cannot be reached or refuses:
    SlurmUnreachable when it could not be asked, SlurmInUse when a reservation to delete has jobs."""

    def capabilities(self) -> Capabilities: ...

    def nodes(self) -> list[SlurmNode]: ...

    def reservations(self) -> list[SlurmReservation]: ...

    def create(self, reservation: SlurmReservation) -> None: ...

    def update(self, reservation: SlurmReservation) -> None: ...

    def delete(self, name: str) -> None: ...

    def release_jobs(self, name: str) -> list[str]: ...
