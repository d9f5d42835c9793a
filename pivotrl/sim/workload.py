"""Seeded workload of the simulator: prompt, response and GenRM lengths (calibration.md §4).

Owns the *hidden* lengths the simulated engines produce. The control plane never sees them: it gets
prompt token counts from a `PromptSource` (as a real data loader would give) and learns response and
judgement lengths from `SequenceFinished` events.

Determinism: every length depends only on (seed, batch, prompt index, sample index) - each prompt
draws from its own generators keyed by those numbers, and draws are taken in sample order - so every
deployment mode, allocation and batch shape sees the same samples.

Model (per batch b, simulated RL step s = step_offset + b):
- prompt length: lognormal(median, sigma) truncated to [1, max_len];
- response length: log r = log m(s) + sigma_p*z_prompt + sigma_r*z_resp, sigma_p^2 + sigma_r^2 =
  sigma^2 (a per-prompt and a per-response component), truncated to [1, max_len]. `m(s)` is the
  median whose untruncated mean is the configured mean curve at step s (or `median*(1+g)^s`);
- GenRM length: log g = log median_g + sigma_g*(rho*z + sqrt(1-rho^2)*z_own), where z is the
  standardised log-response deviation, so log lengths correlate with rho; truncated to [1, max_len].
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from pivotrl.config.models import LengthDist, WorkloadConfig


@dataclass(frozen=True)
class Prompt:
    """One prompt of a batch, as the data loader would describe it."""

    prompt_id: int
    batch: int
    prompt_len: int


@dataclass(frozen=True)
class SampleLengths:
    """Hidden lengths of one sample: its prompt, policy response and GenRM judgement."""

    prompt: int
    response: int
    genrm: int
    judge_key: int = -1
    """Samples of one batch with the same key >= 0 have identical judge prompts (a recorded run's,
    `RunRecords.shared_judgements`): the first to finish its response is judged, the others share
    its judgement (`SequenceFinished.shares_judgement_of`). -1: judged on its own."""


def _trunc(x: float, cap: int) -> int:
    return int(min(max(round(x), 1), cap))


def _interp(curve: list[list[float]], step: float) -> float:
    pts = sorted((float(s), float(v)) for s, v in curve)
    if step <= pts[0][0]:
        return pts[0][1]
    for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
        if step <= s1:
            return v0 + (v1 - v0) * (step - s0) / max(s1 - s0, 1e-12)
    return pts[-1][1]


# Lengths of one prompt, shared by every Workload with the same distribution, seed and group size
# (an allocation sweep runs the same samples dozens of times). Bounded: cleared when it grows big.
_SHARED: dict[tuple, list[SampleLengths]] = {}
_SHARED_MAX = 200_000


class BatchedLengths:
    """Sample ids and lookups over batches of `P` prompts x `G` samples (the interface the
    simulator's runtime uses). Subclasses provide `batch_lengths(batch)` and set `P`, `G`."""

    P: int
    G: int

    @property
    def batch_samples(self) -> int:
        return self.P * self.G

    def sample_id(self, batch: int, prompt: int, index: int) -> int:
        return batch * self.batch_samples + prompt * self.G + index

    def locate(self, sample_id: int) -> tuple[int, int, int]:
        """(batch, prompt, index) of a sample id."""
        batch, rest = divmod(int(sample_id), self.batch_samples)
        prompt, index = divmod(rest, self.G)
        return batch, prompt, index

    def batch_lengths(self, batch: int) -> list[list[SampleLengths]]:
        """[prompt][index] lengths of one batch."""
        raise NotImplementedError

    def lengths(self, sample_id: int) -> SampleLengths:
        b, p, i = self.locate(sample_id)
        return self.batch_lengths(b)[p][i]

    def prompts(self, batch: int) -> list[Prompt]:
        """The prompts of a batch, as the controller's prompt source."""
        return [Prompt(p, batch, row[0].prompt) for p, row in enumerate(self.batch_lengths(batch))]


class Workload(BatchedLengths):
    """Deterministic lengths for batches of `prompts_per_step` prompts x `group_size` responses."""

    def __init__(self, wl: WorkloadConfig, seed: int, prompts_per_step: int, group_size: int,
                 step_offset: int = 0) -> None:
        if wl.response_prompt_sigma > wl.response.sigma:
            raise ValueError(f"models.workload.response_prompt_sigma={wl.response_prompt_sigma} must be "
                             f"<= models.workload.response.sigma={wl.response.sigma}")
        if not -1.0 <= wl.genrm_response_corr <= 1.0:
            raise ValueError(f"models.workload.genrm_response_corr must be in [-1, 1], got {wl.genrm_response_corr}")
        self.wl = wl
        self.seed = int(seed)
        self.P = int(prompts_per_step)
        self.G = int(group_size)
        self.step_offset = int(step_offset)
        self._cache: dict[int, list[list[SampleLengths]]] = {}
        self._key = (repr(wl), self.seed, self.G, self.step_offset)

    # -- lengths ---------------------------------------------------------------------------
    def response_median(self, batch: int) -> float:
        r = self.wl.response
        step = self.step_offset + batch
        if self.wl.response_mean_curve:
            return _interp(self.wl.response_mean_curve, step) / math.exp(r.sigma ** 2 / 2.0)
        return r.median * (1.0 + self.wl.response_growth_per_step) ** step

    def _prompt_lengths(self, batch: int, prompt: int) -> list[SampleLengths]:
        wl = self.wl
        key = [self.seed, batch, prompt]
        g_prompt = np.random.default_rng(key + [0])
        z_len, z_p = g_prompt.standard_normal(2)
        z_r = np.random.default_rng(key + [1]).standard_normal(self.G)
        z_g = np.random.default_rng(key + [2]).standard_normal(self.G)
        p = wl.prompt
        prompt_len = _trunc(p.median * math.exp(p.sigma * z_len), p.max_len)
        sig = wl.response.sigma
        sp = wl.response_prompt_sigma
        sr = math.sqrt(max(sig * sig - sp * sp, 0.0))
        mu = math.log(self.response_median(batch))
        rho = wl.genrm_response_corr
        g: LengthDist = wl.genrm
        out = []
        for i in range(self.G):
            dev = sp * z_p + sr * z_r[i]
            resp = _trunc(math.exp(mu + dev), wl.response.max_len)
            z = dev / sig if sig > 0 else 0.0
            gz = rho * z + math.sqrt(1.0 - rho * rho) * z_g[i]
            out.append(SampleLengths(prompt_len, resp, _trunc(g.median * math.exp(g.sigma * gz), g.max_len)))
        return out

    def batch_lengths(self, batch: int) -> list[list[SampleLengths]]:
        """[prompt][index] lengths of one batch (cached: the runtime asks for each sample)."""
        if batch < 0:
            raise ValueError(f"batch must be >= 0, got {batch}")
        if batch not in self._cache:
            rows = []
            for p in range(self.P):
                key = (self._key, batch, p)
                row = _SHARED.get(key)
                if row is None:
                    if len(_SHARED) >= _SHARED_MAX:
                        _SHARED.clear()
                    row = _SHARED[key] = self._prompt_lengths(batch, p)
                rows.append(row)
            self._cache[batch] = rows
            # keep memory flat on long runs: batches more than a few behind are never asked again
            for old in [b for b in self._cache if b < batch - 8]:
                del self._cache[old]
        return self._cache[batch]
