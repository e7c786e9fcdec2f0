"""Timing helpers: CUDA events for the GPU, ``time.perf_counter`` for the NumPy backend.

Both run ``warmup`` untimed calls, then ``repeat`` timed ones, and report the median, minimum and
20th/80th percentiles in milliseconds. ``rotate`` cycles through several argument sets (so that a
benchmark does not keep hitting the same inputs in L2): call ``i`` runs ``fn(*rotate[i % n])``.

A Rich progress bar (on stderr) appears when the timed calls are expected to take longer than
``progress_after`` seconds, estimated from the warm-up; ``progress=True``/``False`` forces it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

__all__ = ["Timing", "time_cuda", "time_host"]


@dataclass(frozen=True)
class Timing:
    """Times in milliseconds; ``samples`` holds one entry per timed call, in call order."""

    median_ms: float
    min_ms: float
    p20: float
    p80: float
    samples: tuple[float, ...] = field(default=(), repr=False)

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> "Timing":
        if not samples:
            raise ValueError("repeat: need at least one timed call")
        s = sorted(float(x) for x in samples)
        return cls(
            median_ms=statistics.median(s),
            min_ms=s[0],
            p20=_percentile(s, 0.2),
            p80=_percentile(s, 0.8),
            samples=tuple(float(x) for x in samples),
        )

    def as_dict(self) -> dict:
        return {
            "median_ms": self.median_ms,
            "min_ms": self.min_ms,
            "p20_ms": self.p20,
            "p80_ms": self.p80,
            "samples": len(self.samples),
        }


def _percentile(sorted_s: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile of an already sorted sequence."""
    if len(sorted_s) == 1:
        return sorted_s[0]
    pos = q * (len(sorted_s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_s) - 1)
    return sorted_s[lo] + (sorted_s[hi] - sorted_s[lo]) * (pos - lo)


def _check_counts(warmup: int, repeat: int) -> None:
    if int(warmup) < 0:
        raise ValueError(f"warmup: must be >= 0, got {warmup}")
    if int(repeat) < 1:
        raise ValueError(f"repeat: must be >= 1, got {repeat}")


def _caller(fn: Callable, rotate: Sequence[Sequence[Any]] | None) -> Callable[[int], Any]:
    if rotate is None:
        return lambda i: fn()
    sets = list(rotate)
    if not sets:
        raise ValueError("rotate: need at least one argument set")
    return lambda i: fn(*sets[i % len(sets)])


class _Bar:
    """A Rich progress bar on stderr, or nothing."""

    def __init__(self, enabled: bool, total: int, label: str):
        self._progress = None
        self._task = None
        if not enabled:
            return
        try:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )
        except Exception:  # noqa: BLE001 - rich is optional here
            return
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task(label, total=total)

    def advance(self) -> None:
        if self._progress is not None:
            self._progress.advance(self._task)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


def _want_bar(progress: bool | None, est_s: float, after: float) -> bool:
    return bool(progress) if progress is not None else est_s > after


def time_cuda(
    fn: Callable,
    *,
    warmup: int = 5,
    repeat: int = 20,
    rotate: Sequence[Sequence[Any]] | None = None,
    progress: bool | None = None,
    progress_after: float = 3.0,
    label: str = "timing",
    stream=None,
) -> Timing:
    """Time ``fn`` on the GPU with a pair of ``cupy.cuda.Event`` around each call.

    Warm-up calls are excluded (with ``warmup=0`` one untimed call is still made, to estimate
    the run time and to keep one-time compilation out of the samples). At most two timed calls are in flight at once (the host waits for
    call ``i - 1`` after launching call ``i``), so the GPU stays fed and the progress bar is
    honest. ``stream`` defaults to the current stream; ``fn`` must launch its work on it.
    """
    import cupy

    _check_counts(warmup, repeat)
    call = _caller(fn, rotate)
    stream = stream if stream is not None else cupy.cuda.get_current_stream()

    t0 = time.perf_counter()
    n_probe = max(int(warmup), 1)
    for i in range(n_probe):
        call(i)
    stream.synchronize()
    per_call = (time.perf_counter() - t0) / n_probe

    bar = _Bar(_want_bar(progress, per_call * repeat, progress_after), int(repeat), label)
    events: list[tuple[Any, Any]] = []
    try:
        for i in range(int(repeat)):
            start, end = cupy.cuda.Event(), cupy.cuda.Event()
            start.record(stream)
            call(n_probe + i)
            end.record(stream)
            events.append((start, end))
            if i > 0:
                events[i - 1][1].synchronize()
                bar.advance()
        events[-1][1].synchronize()
        bar.advance()
    finally:
        bar.close()
    samples = [cupy.cuda.get_elapsed_time(s, e) for s, e in events]
    return Timing.from_samples(samples)


def time_host(
    fn: Callable,
    *,
    warmup: int = 1,
    repeat: int = 5,
    rotate: Sequence[Sequence[Any]] | None = None,
    progress: bool | None = None,
    progress_after: float = 3.0,
    label: str = "timing",
) -> Timing:
    """Time ``fn`` on the host with ``time.perf_counter`` (the NumPy backend).

    Warm-up calls are excluded. With ``warmup=0`` the first timed call also serves as the
    estimate for whether to show a progress bar (shown only from the second call on).
    """
    _check_counts(warmup, repeat)
    call = _caller(fn, rotate)
    per_call = None
    if int(warmup) > 0:
        t0 = time.perf_counter()
        for i in range(int(warmup)):
            call(i)
        per_call = (time.perf_counter() - t0) / int(warmup)

    samples: list[float] = []
    bar = None
    try:
        for i in range(int(repeat)):
            t0 = time.perf_counter()
            call(int(warmup) + i)
            samples.append((time.perf_counter() - t0) * 1e3)
            if bar is None:
                per_call = per_call if per_call is not None else samples[0] / 1e3
                show = _want_bar(progress, per_call * repeat, progress_after)
                bar = _Bar(show and repeat > 1, int(repeat), label)
            bar.advance()
    finally:
        if bar is not None:
            bar.close()
    return Timing.from_samples(samples)
