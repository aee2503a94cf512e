"""The one percentile of the project: the latency page (chat/infra/latency.py) and the benchmarks
(bench/) both report with it, so their p50 and p95 of the same answers agree.

Interpolated, not nearest-rank: on the few dozen answers of a latency bucket or a benchmark run,
nearest-rank jumps from one sample to the next as a single answer comes or goes, while linear
interpolation moves smoothly and is what numpy (default "linear") and
`statistics.quantiles(method="inclusive")` give, so a reader can check a figure by hand.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float | None], p: float) -> float | None:
    """The p-th percentile (0..100) with linear interpolation between closest ranks.

    rank = (n - 1) * p / 100 into the sorted values, interpolated between its two neighbours.
    None values are left out; None for no values.
    """
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be within 0..100, not {p!r}")
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    rank = (len(xs) - 1) * p / 100
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (rank - lo))
