"""Statistics of a measurement: percentiles, means and 95% confidence intervals (Student's t)."""
from __future__ import annotations

import math
from collections.abc import Sequence

# two-sided 95% critical values of Student's t for 1..30 degrees of freedom
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t95(df: int) -> float:
    if df < 1:
        return math.inf
    return _T95[df - 1] if df <= len(_T95) else 1.96 + 2.4 / df


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation, as numpy's default."""
    if not values:
        return None
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ci95(values: Sequence[float]) -> tuple[float, float] | None:
    """(mean, half-width) of the 95% confidence interval of the mean; None with fewer than two values."""
    n = len(values)
    if n < 2:
        return None
    m = sum(values) / n
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return m, t95(n - 1) * sd / math.sqrt(n)


def relative_half_width(values: Sequence[float]) -> float | None:
    """The 95% interval's half-width relative to the mean (0.03 = +-3%)."""
    ci = ci95(values)
    if ci is None or ci[0] == 0:
        return None
    return ci[1] / abs(ci[0])
