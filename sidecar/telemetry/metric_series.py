"""The values of the contract's metrics as plain numbers in dicts keyed by label values,
turned into Prometheus metric families only when scraped.

prometheus_client's own metrics take a lock and build a value object per child on every
``inc``/``observe``: about 30k instructions per request (of ~840k) for the dozen
updates a request makes. Here an update is a dict look-up and an addition.

Thread safety: there is no lock because there is one writer and one reader on the same
thread. Every event that moves a metric is emitted on the event loop (the pipeline, the
LLM call and the fleet store are coroutines on it; the repairer's worker threads only
build prompts), and ``/metrics`` is an aiohttp handler of the admin app served by the
same loop, which renders the exposition synchronously between two callbacks.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.samples import Exemplar
from prometheus_client.utils import INF, floatToGoString

Labels = tuple[str, ...]


class CounterSeries:
    """A counter's value per label values."""

    def __init__(self, name: str, documentation: str, labelnames: Labels = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


class GaugeSeries:
    """A gauge's value per label values; ``read``, when given, is asked for the value of
    an unlabelled gauge at each scrape instead."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Labels = (),
        read: Callable[[], float] | None = None,
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.read = read
        # An unlabelled gauge is exposed from the start, at 0, as prometheus_client does.
        self.values: dict[Labels, float] = {} if labelnames else {(): 0.0}

    def set(self, labels: Labels, value: float) -> None:
        self.values[labels] = value

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def family(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        if self.read is not None:
            family.add_metric((), float(self.read()))
            return family
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


class _Buckets:
    """One histogram series: observations per bucket (not cumulative), their sum, and
    each bucket's latest exemplar."""

    __slots__ = ("counts", "exemplars", "total")

    def __init__(self, size: int) -> None:
        self.counts = [0] * size
        self.total = 0.0
        self.exemplars: list[Exemplar | None] = [None] * size


class HistogramSeries:
    """A histogram's buckets per label values. ``bounds`` are the upper bounds without
    +Inf, which is added."""

    def __init__(
        self, name: str, documentation: str, bounds: Iterable[float], labelnames: Labels = ()
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = labelnames
        self.bounds = (*(float(bound) for bound in bounds), INF)
        # The `le` label as prometheus_client writes a bound: 1 as "1.0", +Inf as "+Inf".
        self._les = tuple(floatToGoString(bound) for bound in self.bounds)  # type: ignore[no-untyped-call]
        # An unlabelled histogram is exposed from the start, as prometheus_client does.
        self.series: dict[Labels, _Buckets] = {} if labelnames else {(): _Buckets(len(self.bounds))}

    def observe(
        self, labels: Labels, amount: float, exemplar: dict[str, str] | None = None
    ) -> None:
        series = self.series.get(labels)
        if series is None:
            series = self.series[labels] = _Buckets(len(self.bounds))
        # The first bucket whose bound is at least the amount: ``le`` is inclusive.
        index = bisect_left(self.bounds, amount)
        series.counts[index] += 1
        series.total += amount
        if exemplar:
            series.exemplars[index] = Exemplar(exemplar, amount, time.time())

    def family(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, series in self.series.items():
            cumulative = 0.0
            buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
            for le, count, exemplar in zip(self._les, series.counts, series.exemplars, strict=True):
                cumulative += count
                buckets.append((le, cumulative) if exemplar is None else (le, cumulative, exemplar))
            family.add_metric(labels, buckets, series.total)
        return family
