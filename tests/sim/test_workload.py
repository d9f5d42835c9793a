"""The seeded workload: same samples for every mode and batch shape, calibrated shapes."""
from __future__ import annotations

import math

import numpy as np

from pivotrl.config.models import WorkloadConfig
from pivotrl.sim.workload import Workload


def test_lengths_depend_only_on_seed_batch_prompt_index(make_cfg):
    wl = make_cfg("models=qwen7b_qwen30b").models.workload
    a = Workload(wl, seed=3, prompts_per_step=16, group_size=8)
    b = Workload(wl, seed=3, prompts_per_step=4, group_size=2)   # another batch shape
    for batch in (0, 2):
        for p in range(4):
            for i in range(2):
                assert a.batch_lengths(batch)[p][i] == b.batch_lengths(batch)[p][i]
    c = Workload(wl, seed=4, prompts_per_step=16, group_size=8)
    assert a.batch_lengths(0) != c.batch_lengths(0)


def test_sample_ids_round_trip(make_cfg):
    w = Workload(make_cfg("models=qwen7b_qwen30b").models.workload, 0, 8, 4)
    for sid in (0, 5, 31, 32, 100):
        b, p, i = w.locate(sid)
        assert w.sample_id(b, p, i) == sid
        assert w.lengths(sid) == w.batch_lengths(b)[p][i]


def test_lengths_are_truncated_and_shaped(make_cfg):
    wl = make_cfg("models=qwen7b_qwen30b").models.workload
    w = Workload(wl, 0, 256, 8)
    rows = [x for row in w.batch_lengths(0) for x in row]
    resp = np.array([x.response for x in rows])
    gen = np.array([x.genrm for x in rows])
    prm = np.array([x.prompt for x in rows])
    assert resp.min() >= 1 and resp.max() <= wl.response.max_len
    assert gen.max() <= wl.genrm.max_len and prm.max() <= wl.prompt.max_len
    assert 600 < resp.mean() < 1000                 # the curve's mean at step 0 is 800
    assert 100 < np.median(prm) < 220
    # GenRM length correlates with the response length (rho = 0.3 in log space)
    r = np.corrcoef(np.log(resp), np.log(gen))[0, 1]
    assert 0.15 < r < 0.45
    # per-prompt component: responses of one prompt are more alike than across prompts
    by_prompt = np.log(resp).reshape(256, 8)
    assert by_prompt.std(axis=1).mean() < np.log(resp).std()


def test_mean_grows_with_step():
    wl = WorkloadConfig(response_mean_curve=[[0.0, 800.0], [300.0, 2500.0]])
    early = Workload(wl, 0, 64, 8, step_offset=0)
    late = Workload(wl, 0, 64, 8, step_offset=300)
    assert late.response_median(0) == 2500.0 / math.exp(0.5)
    m_early = np.mean([x.response for row in early.batch_lengths(0) for x in row])
    m_late = np.mean([x.response for row in late.batch_lengths(0) for x in row])
    assert m_late > 2 * m_early
