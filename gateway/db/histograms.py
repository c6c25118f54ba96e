"""Latency histograms: log-spaced buckets whose percentiles stay within 1% of the exact ones.

Used by the rollups (tool_call_hourly and latency_hourly, and latency_bucket() in schema.sql):
durations are integer milliseconds. Bucket i < 50 holds exactly i ms. From 50 ms up, bucket
i = 50 + floor(log(ms / 50) / log(1.02)) holds [50 * 1.02**(i-50), 50 * 1.02**(i-49)): each bucket
is 2% wider than the one before, about 940 buckets up to 2**31 ms. A histogram is a dense
integer[] where element i (0-based here, i + 1 in SQL) counts bucket i; it only reaches the
highest bucket seen. Merging is element-wise addition (histogram_add(), and the aggregate
histogram_sum() in SQL). bucket_value(i) maps a bucket back to one value whose
relative error against any duration in that bucket is at most 0.99%, so a nearest-rank
percentile read with percentile() is within 1% of the exact one.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Sequence

EXACT_BELOW_MS = 50
GROWTH = 1.02
_LOG_GROWTH = math.log(GROWTH)


def latency_bucket(duration_ms: int) -> int:
    """The histogram bucket of a duration; the same as latency_bucket() in schema.sql."""
    if duration_ms < EXACT_BELOW_MS:
        return max(duration_ms, 0)
    return EXACT_BELOW_MS + math.floor(math.log(duration_ms / EXACT_BELOW_MS) / _LOG_GROWTH)


def bucket_bounds(bucket: int) -> tuple[int, int]:
    """The smallest and largest integer durations that fall into a bucket."""
    if bucket < EXACT_BELOW_MS:
        return bucket, bucket
    low = EXACT_BELOW_MS * GROWTH ** (bucket - EXACT_BELOW_MS)
    high = EXACT_BELOW_MS * GROWTH ** (bucket - EXACT_BELOW_MS + 1)
    smallest = math.ceil(low)
    # Guard the float edges by asking the bucket function itself.
    while latency_bucket(smallest) < bucket:
        smallest += 1
    while smallest > 0 and latency_bucket(smallest - 1) == bucket:
        smallest -= 1
    largest = max(smallest, math.ceil(high) - 1)
    while latency_bucket(largest) > bucket:
        largest -= 1
    while latency_bucket(largest + 1) == bucket:
        largest += 1
    return smallest, largest


def bucket_value(bucket: int) -> float:
    """One value standing for every duration in the bucket: the point whose relative distance to
    both ends is equal (at most (1.02 - 1) / (1.02 + 1) < 1%)."""
    low, high = bucket_bounds(bucket)
    if low == high:
        return float(low)
    return 2 * low * high / (low + high)


# A few thousand buckets at most: each value is worked out once.
_cached_value = functools.cache(bucket_value)


def percentiles(histogram: Sequence[int], fractions: Sequence[float]) -> list[float] | None:
    """Nearest-rank percentiles (fractions 0..1) of a histogram; None when it is empty. One
    pass in C for the running counts, then a binary search per rank."""
    running = list(itertools.accumulate(histogram))
    total = running[-1] if running else 0
    if total == 0:
        return None
    return [
        _cached_value(bisect.bisect_left(running, max(1, math.ceil(fraction * total))))
        for fraction in fractions
    ]


def percentile(histogram: Sequence[int], fraction: float) -> float | None:
    """One nearest-rank percentile (fraction 0..1) of a histogram; None when it is empty."""
    values = percentiles(histogram, (fraction,))
    return None if values is None else values[0]
