"""Timing samples from vLLM for the throughput model: a `StatLoggerBase` that feeds `StatState`.

Owns `StatState` (running/waiting counts, KV usage and the samples gathered so far) and
`make_stat_logger`, the logger class vLLM instantiates: one sample per engine output batch with
N = running requests, K = tokens of the live sequences (from the engine's `kv_tokens` callback)
and seconds = the time since the previous batch. Client-side timestamps, so they include output
processing; decode-only batches are iteration samples, batches that carried prompt tokens are
prefill samples. At most `MAX_SAMPLES` of each are kept.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from pivotrl.engines.protocol import IterationSample, PrefillSample

__all__ = ["StatState", "make_stat_logger", "MAX_SAMPLES"]

MAX_SAMPLES = 10_000


@dataclass
class StatState:
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    last_ts: float | None = None
    iters: list = field(default_factory=list)
    prefills: list = field(default_factory=list)


def make_stat_logger(st: StatState, kv_tokens: Callable[[], int]) -> type:
    """A vLLM `StatLoggerBase` subclass recording into `st` (see the module docstring)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _PivotStatLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            self.block_size = vllm_config.cache_config.block_size

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            now = time.perf_counter()
            if scheduler_stats is not None:
                st.running, st.waiting = scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs
                st.kv_usage = scheduler_stats.kv_cache_usage
            if iteration_stats is None:
                return
            prev, st.last_ts = st.last_ts, now
            if prev is None or st.running == 0:
                return
            dt = now - prev
            k = kv_tokens()
            if iteration_stats.num_prompt_tokens:
                st.prefills.append(PrefillSample(iteration_stats.num_prompt_tokens, st.running, dt))
            else:
                st.iters.append(IterationSample(st.running, k, dt))
            del st.iters[:-MAX_SAMPLES], st.prefills[:-MAX_SAMPLES]

        def log_engine_initialized(self) -> None:
            pass

    return _PivotStatLogger
