"""The progress bar, shared with `relpos_ref.blocked` (it lives in `relpos_ref._progress`)."""

from __future__ import annotations

from .._progress import Progress

__all__ = ["Progress"]
