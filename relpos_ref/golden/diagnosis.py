"""A diagnosis: an obtained output's distance from the golden and from each variant.

`relpos_ref.golden.diagnose` computes them; this is what it reports.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["MUCH_CLOSER", "CaseDiagnosis", "VariantResult"]


@dataclass(frozen=True)
class VariantResult:
    """How far the obtained output is from one variant: ``max |obtained - variant| / atol``."""

    name: str
    max_error: float
    ratio: float

    @property
    def matches(self) -> bool:
        return self.ratio <= 1.0


#: A nearest variant is named only when it is at least this many times closer to the
#: obtained output than the golden is (see ``docs/golden.md``, "Diagnosing a mismatch").
MUCH_CLOSER = 10.0


@dataclass
class CaseDiagnosis:
    """The obtained output against the golden and against every variant, nearest first.

    Every distance is ``max |obtained - reference| / atol``: in units of the
    case's ``output`` tolerance.
    """

    case_id: str
    golden_ratio: float
    variants: list[VariantResult] = field(default_factory=list)

    @property
    def matches_golden(self) -> bool:
        return self.golden_ratio <= 1.0

    @property
    def nearest(self) -> VariantResult | None:
        """The nearest variant when none matches but it is `MUCH_CLOSER` than the golden."""
        if not self.variants or self.variants[0].matches:
            return None
        near = self.variants[0]
        return near if near.ratio * MUCH_CLOSER <= self.golden_ratio else None

    @property
    def verdict(self) -> str:
        """One line: the golden matches, a variant matches, or the nearest variant."""
        if self.matches_golden:
            return (f"{self.case_id}: matches the golden ({self.golden_ratio:.2g}x the "
                    "tolerance)")
        head = f"{self.case_id}: {self.golden_ratio:.3g}x the tolerance from the golden"
        found = [v for v in self.variants if v.matches]
        if found:
            names = ", ".join(v.name for v in found)
            return f"{head}; matches {names} ({found[0].ratio:.2g}x the tolerance)"
        near = self.nearest
        if near is not None:
            return (f"{head}; no known mistake matches; nearest variant {near.name} at "
                    f"{near.ratio:.3g}x the tolerance, "
                    f"{self.golden_ratio / near.ratio:.3g} times closer than the golden")
        return f"{head}; no known mistake matches or comes {MUCH_CLOSER:g} times closer"

    def lines(self) -> Iterator[str]:
        yield self.verdict
        if not self.matches_golden:
            for v in self.variants:
                yield (f"  {v.name:<22} {v.ratio:10.3g}x the tolerance  "
                       f"(max |err| {v.max_error:.3g})")

    def as_dict(self) -> dict[str, Any]:
        return {"case": self.case_id, "golden_ratio": _finite(self.golden_ratio),
                "matches_golden": self.matches_golden,
                "nearest": self.nearest.name if self.nearest else None,
                "variants": [{"name": v.name, "ratio": _finite(v.ratio),
                              "max_error": _finite(v.max_error), "matches": v.matches}
                             for v in self.variants]}


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else repr(x)


def _ratio(obtained: np.ndarray, want: np.ndarray, atol: float) -> tuple[float, float]:
    err = np.abs(obtained - want)
    err = np.where(np.isfinite(obtained) & np.isfinite(want), err, np.inf)
    worst = float(err.max()) if err.size else 0.0
    return worst, (worst / atol if atol > 0 else (0.0 if worst == 0 else math.inf))
