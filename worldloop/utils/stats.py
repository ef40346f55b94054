"""Small statistics that every report needs."""

from __future__ import annotations

import math
from typing import Sequence


def rate_with_stderr(outcomes: Sequence[bool] | Sequence[float]) -> tuple[float, float]:
    """Mean of 0/1 outcomes and its binomial standard error sqrt(p (1 - p) / n)."""
    n = len(outcomes)
    if n == 0:
        return float("nan"), float("nan")
    p = float(sum(float(o) for o in outcomes)) / n
    return p, math.sqrt(p * (1.0 - p) / n)


def format_rate(outcomes: Sequence[bool] | Sequence[float]) -> str:
    """'0.820 ± 0.054 (n=50)'."""
    p, se = rate_with_stderr(outcomes)
    return f"{p:.3f} ± {se:.3f} (n={len(outcomes)})"
