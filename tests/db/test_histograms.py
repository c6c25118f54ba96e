"""Latency histogram buckets: within 1% everywhere, the same in Python and SQL."""

from __future__ import annotations

import random

import asyncpg

from gateway.db.histograms import (
    bucket_bounds,
    bucket_value,
    latency_bucket,
    percentile,
    percentiles,
)


def test_buckets_are_within_one_percent() -> None:
    assert [latency_bucket(ms) for ms in range(50)] == list(range(50))
    previous = 49
    for bucket in range(50, 940):
        low, high = bucket_bounds(bucket)
        value = bucket_value(bucket)
        if low > high:  # a bucket narrower than 1 ms holds no integer
            continue
        assert low == previous + 1
        previous = high
        for ms in {low, high, (low + high) // 2}:
            assert latency_bucket(ms) == bucket
            assert abs(value - ms) / ms < 0.01, (bucket, ms, value)
    assert latency_bucket(2**31 - 1) < 940


async def test_sql_buckets_match_python(db: asyncpg.Connection) -> None:
    rng = random.Random(4)
    values = list(range(0, 5000)) + [rng.randrange(5000, 2**31) for _ in range(20000)]
    rows = await db.fetch("SELECT v, latency_bucket(v) AS b FROM unnest($1::bigint[]) AS v", values)
    mismatches = [(r["v"], r["b"]) for r in rows if r["b"] != latency_bucket(r["v"])]
    assert not mismatches


def test_percentile_of_a_histogram() -> None:
    assert percentile([], 0.5) is None
    histogram = [1, 2, 0, 1]  # 0 ms once, 1 ms twice, 3 ms once
    assert percentile(histogram, 0.5) == 1
    assert percentile(histogram, 1.0) == 3
    assert percentile(histogram, 0.0) == 0
    assert percentiles(histogram, (0.0, 0.5, 0.75, 0.76, 1.0)) == [0, 1, 1, 3, 3]
