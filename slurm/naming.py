"""How the portal names what it keeps in a Slurm cluster, and what it makes of Slurm's GPUs: in one place, because
the import writes these names and the reconcile pass and the pages read them back."""

from __future__ import annotations

import uuid

from slurm.scontrol import RESERVATION_PREFIX, is_ours

UUID_NAMESPACE = uuid.UUID("2f8c0e4a-9b61-4d2e-8a53-1c7d5e6f9a10")  # the portal's own: GPU ids for Slurm's GPUs
MODEL_PREFIX = "Slurm GPU"


def reservation_name(reservation_id: int) -> str:
    return f"{RESERVATION_PREFIX}{reservation_id}"


def slurm_gpu_uuid(node: str, index: int) -> str:
    """Slurm knows a node's GPUs by count, not by UUID: the portal names each by the node and its place."""
    return f"GPU-{uuid.uuid5(UUID_NAMESPACE, f'slurm/{node}/{index}')}"


def slurm_gpu_model(gres_type: str) -> str:
    return f"{MODEL_PREFIX} ({gres_type})" if gres_type else MODEL_PREFIX


def gres_type_of(model: str) -> str:
    """The GRES type a Slurm GPU's model names ("Slurm GPU (a100)" -> "a100"); "" for an untyped one."""
    prefix = f"{MODEL_PREFIX} ("
    return model.removeprefix(prefix).removesuffix(")") if model.startswith(prefix) else ""


def booking_id_of(name: str) -> int | None:
    """The booking a reservation of the portal's is for ("gpubook-42" -> 42); None for anyone else's."""
    return int(name.removeprefix(RESERVATION_PREFIX)) if is_ours(name) else None
