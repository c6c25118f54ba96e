"""What a gateway process counts, for GET /api/v1/metrics.

Counting is plain Python (a dict entry and an addition per event): cheap enough for the proxy's
hot path, where a labelled prometheus_client metric takes a label lookup and a lock per
operation, 4.5 µs per proxied request for the three series the proxy feeds, against 0.4 µs
here. prometheus_client still renders the text format, from a snapshot taken at scrape time.

Label sets are bounded: method classes, outcomes, kinds, statuses, cache names, never a
workspace or server id (unless GATEWAY_METRICS_PER_SERVER adds `server_id` to the proxy's
request counter, for small deployments). Every series carries `worker`: under
`serve --workers N` a scrape reaches one worker, which answers for all of them, from the
snapshots each writes every SNAPSHOT_SECONDS (gateway.ops.snapshots).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from aiohttp import web
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

PREFIX = "mcp_gateway_"
# Prometheus' usual latency buckets, from half a millisecond (the proxy's own time) to a minute
# (the proxy's timeout).
SECONDS_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip

# What the proxy tells apart: POST with a tools/call, other POSTs, GET (the server's stream of
# a session), DELETE (the end of a session).
METHOD_CLASSES = ("tools_call", "request", "stream", "session_end")

Kind = Literal["counter", "gauge", "histogram"]
Labels = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Series:
    """One metric of one process, as data: what a snapshot holds and what /metrics renders."""

    kind: Kind
    name: str
    documentation: str
    labelnames: Labels
    # labels -> a number, or for a histogram ([count per bucket, the last one above all], sum)
    values: list[tuple[Labels, Any]]


class Counter:
    __slots__ = ("documentation", "labelnames", "name", "values")

    def __init__(self, name: str, documentation: str, labelnames: Labels = ()) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.values: dict[Labels, float] = {}

    def inc(self, *labels: str, amount: float = 1) -> None:
        values = self.values
        values[labels] = values.get(labels, 0) + amount

    def series(self) -> Series:
        return Series(
            "counter", self.name, self.documentation, self.labelnames, list(self.values.items())
        )


class Histogram:
    __slots__ = ("buckets", "documentation", "labelnames", "name", "values")

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Labels = (),
        buckets: tuple[float, ...] = SECONDS_BUCKETS,
    ) -> None:
        self.name, self.documentation, self.labelnames = name, documentation, labelnames
        self.buckets = buckets
        # labels -> [counts per bucket (one more for +Inf), sum]
        self.values: dict[Labels, list[Any]] = {}

    def observe(self, value: float, *labels: str) -> None:
        observe(self.entry(*labels), value, self.buckets)

    def entry(self, *labels: str) -> list[Any]:
        """The [counts, sum] of these labels, for a hot path to observe into directly."""
        entry = self.values.get(labels)
        if entry is None:
            entry = self.values[labels] = [[0] * (len(self.buckets) + 1), 0.0]
        return entry

    def series(self) -> Series:
        values = [
            (labels, (list(counts), total)) for labels, (counts, total) in self.values.items()
        ]
        return Series("histogram", self.name, self.documentation, self.labelnames, values)


def observe(entry: list[Any], value: float, buckets: tuple[float, ...] = SECONDS_BUCKETS) -> None:
    entry[0][bisect.bisect_left(buckets, value)] += 1  # `le`: bounds are inclusive
    entry[1] += value


@dataclass(frozen=True, slots=True)
class Reading:
    """A value read when a snapshot is taken (a queue's length, the pool's size)."""

    kind: Kind
    name: str
    documentation: str
    labelnames: Labels
    read: Callable[[], Iterable[tuple[Labels, float]]]

    def series(self) -> Series:
        return Series(self.kind, self.name, self.documentation, self.labelnames, list(self.read()))


@dataclass
class Metrics:
    """The instruments of one process. The hot paths hold direct references to them."""

    per_server: bool = False
    proxy_requests: Counter = field(init=False)
    proxy_upstream_seconds: Histogram = field(
        default_factory=lambda: Histogram(
            "proxy_upstream_seconds",
            "The upstream's time in a proxied request: from forwarding it until the reply was "
            "read whole (for a streamed reply, until its headers)",
            ("method_class",),
        )
    )
    proxy_gateway_seconds: Histogram = field(
        default_factory=lambda: Histogram(
            "proxy_gateway_seconds",
            "The gateway's own time in a proxied request: everything but waiting for the "
            "upstream's answer (for a streamed answer, until the upstream's headers)",
            ("method_class",),
        )
    )
    upstream_errors: Counter = field(
        default_factory=lambda: Counter(
            "upstream_errors",
            "Proxied exchanges with an upstream that failed, by kind (unreachable, refused: "
            "outbound policy, timeout, broke_off, shutdown, http_5xx)",
            ("kind",),
        )
    )
    probes: Counter = field(
        default_factory=lambda: Counter(
            "probes", "Health probes of upstream servers, by resulting status", ("status",)
        )
    )
    probe_seconds: Histogram = field(
        default_factory=lambda: Histogram(
            "probe_seconds", "How long a health probe took, by resulting status", ("status",)
        )
    )
    alert_evaluations: Counter = field(
        default_factory=lambda: Counter(
            "alert_evaluations",
            "Alert rule evaluations per (rule, server), by result (ok, firing, resolved, "
            "no_data, failed)",
            ("result",),
        )
    )
    notifications: Counter = field(
        default_factory=lambda: Counter(
            "alert_notification_attempts",
            "Alert notification delivery attempts, by result (delivered, retry, failed)",
            ("result",),
        )
    )
    cache_requests: Counter = field(
        default_factory=lambda: Counter(
            "cache_requests", "Cache lookups by cache and result (hit, miss)", ("cache", "result")
        )
    )
    pool_wait_seconds: Histogram = field(
        default_factory=lambda: Histogram(
            "db_pool_wait_seconds", "Time to get a PostgreSQL connection from the pool"
        )
    )
    readings: list[Reading] = field(default_factory=list)
    # method class -> the entries of proxy_upstream_seconds and proxy_gateway_seconds, which
    # the proxy observes into without a lookup by labels.
    proxy_times: dict[str, tuple[list[Any], list[Any]]] = field(init=False)

    def __post_init__(self) -> None:
        labels: Labels = ("method_class", "outcome")
        self.proxy_requests = Counter(
            "proxy_requests",
            "Proxied requests by method class (tools_call, request, stream, session_end) and "
            "outcome (ok, upstream_4xx, upstream_5xx, unreachable, timeout, broke_off, "
            "caller_left)",
            (*labels, "server_id") if self.per_server else labels,
        )
        self.proxy_times = {
            method_class: (
                self.proxy_upstream_seconds.entry(method_class),
                self.proxy_gateway_seconds.entry(method_class),
            )
            for method_class in METHOD_CLASSES
        }

    def series(self) -> list[Series]:
        instruments = (
            self.proxy_requests,
            self.proxy_upstream_seconds,
            self.proxy_gateway_seconds,
            self.upstream_errors,
            self.probes,
            self.probe_seconds,
            self.alert_evaluations,
            self.notifications,
            self.cache_requests,
            self.pool_wait_seconds,
        )
        return [i.series() for i in instruments] + [r.series() for r in self.readings]


def families(snapshots: Iterable[tuple[int, list[Series]]]) -> Iterator[Metric]:
    """The processes' series as Prometheus metric families, each series labelled with its
    worker."""
    merged: dict[str, Metric] = {}
    for worker, series_list in snapshots:
        worker_label = str(worker)
        for series in series_list:
            family = merged.get(series.name)
            if family is None:
                family = merged[series.name] = _family(series)
            for labels, value in series.values:
                labelled = [*labels, worker_label]
                if series.kind == "histogram":
                    counts, total = value
                    family.add_metric(labelled, _cumulative(counts), total)  # type: ignore[attr-defined]
                else:
                    family.add_metric(labelled, value)  # type: ignore[attr-defined]
    yield from merged.values()


def _family(series: Series) -> Metric:
    name, labels = PREFIX + series.name, [*series.labelnames, "worker"]
    if series.kind == "counter":
        return CounterMetricFamily(name, series.documentation, labels=labels)
    if series.kind == "gauge":
        return GaugeMetricFamily(name, series.documentation, labels=labels)
    return HistogramMetricFamily(name, series.documentation, labels=labels)


def _cumulative(counts: list[int]) -> list[tuple[str, float]]:
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*SECONDS_BUCKETS, float("inf")), counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
    return buckets


def dump(series_list: list[Series]) -> bytes:
    return orjson.dumps(
        [[s.kind, s.name, s.documentation, s.labelnames, s.values] for s in series_list]
    )


def load(raw: bytes) -> list[Series]:
    return [
        Series(kind, name, documentation, tuple(labelnames), [(tuple(k), v) for k, v in values])
        for kind, name, documentation, labelnames, values in orjson.loads(raw)
    ]


# What this process counts, for /metrics (the hot paths hold their instruments directly).
METRICS: web.AppKey[Metrics] = web.AppKey("metrics")
