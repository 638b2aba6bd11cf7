"""A dependency-free progress bar that stays silent when the stream is not a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """``with Progress(total, "generate") as bar: bar.advance(label)``.

    Draws ``label [#####.....] 12/88 shaw/clip/...`` on `stream` (stderr by
    default) only when it is a terminal; otherwise it prints nothing.
    """

    def __init__(
        self,
        total: int,
        title: str,
        *,
        stream: TextIO | None = None,
        enabled: bool | None = None,
    ) -> None:
        self.total = total
        self.title = title
        self.stream = sys.stderr if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty()) if enabled is None else enabled
        self.done = 0
        self._last = 0.0

    def __enter__(self) -> Progress:
        return self

    def advance(self, label: str = "") -> None:
        """Count one item done and redraw (at most 20 times a second)."""
        self.done += 1
        now = time.monotonic()
        if not self.enabled or (now - self._last < 0.05 and self.done < self.total):
            return
        self._last = now
        width = 30
        filled = width * self.done // max(self.total, 1)
        bar = "#" * filled + "." * (width - filled)
        text = f"\r{self.title} [{bar}] {self.done}/{self.total} {label}"
        self.stream.write(text[:120].ljust(120))
        self.stream.flush()

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * 120 + "\r")
            self.stream.flush()
