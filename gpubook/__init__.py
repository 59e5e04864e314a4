"""gpubook: a command-line client for the GPU booking portal's REST API (standard library only)."""

from __future__ import annotations

__version__ = "0.1.0"
