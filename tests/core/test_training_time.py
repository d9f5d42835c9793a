"""The training-time model elastic training is priced with, and its online fit (pure)."""
import math

import pytest

from pivotrl.core.training_time import TrainTimeFit, TrainTimeModel


def test_formula_and_its_scaling_losses():
    m = TrainTimeModel(fixed_s=2.0, token_s=0.01, comm_s=0.4, cross_node_s=3.0, node_size=8)
    assert m.seconds(1, 1000) == pytest.approx(2.0 + 10.0)
    assert m.seconds(4, 1000) == pytest.approx(2.0 + 2.5 + 0.4 * 3 / 4)
    assert m.seconds(16, 1000) == pytest.approx(2.0 + 10 / 16 + (0.4 + 3.0) * 15 / 16)  # spans two nodes
    assert not m.spans_nodes(8) and m.spans_nodes(9)
    assert TrainTimeModel(token_s=1.0).seconds(64, 64) == pytest.approx(1.0)  # node_size 0: one node
    with pytest.raises(ValueError, match="world=0"):
        m.seconds(0, 10)
    for bad in (dict(fixed_s=-1.0), dict(token_s=math.nan), dict(node_size=-2)):
        with pytest.raises(ValueError, match="TrainTimeModel"):
            TrainTimeModel(**bad)
    assert set(m.as_record()) == {"fixed_s", "token_s", "comm_s", "cross_node_s", "node_size"}


def test_one_world_size_is_the_optimistic_guess_and_two_recover_the_truth():
    truth = TrainTimeModel(fixed_s=0.4, token_s=0.002, comm_s=0.2)
    f = TrainTimeFit()
    assert f.model() is None  # nothing measured, no prior: the planner keeps the home set
    for tok in (1000, 1200, 900):
        f.observe(1, tok, truth.seconds(1, tok))
    m = f.model()
    assert m.fixed_s == m.comm_s == 0.0 and m.seconds(2, 1000) == pytest.approx(m.seconds(1, 1000) / 2)
    for w, tok in ((2, 1000), (2, 1300), (4, 1100)):
        f.observe(w, tok, truth.seconds(w, tok))
    m = f.model()
    assert f.worlds() == [1, 2, 4]
    for w in (1, 2, 3, 4, 8):
        assert m.seconds(w, 1000) == pytest.approx(truth.seconds(w, 1000), rel=1e-6)


def test_fit_stays_non_negative_on_noisy_steps_and_skips_bad_ones():
    f = TrainTimeFit(window=4)
    for w, s in ((1, 3.0), (2, 2.9), (1, 2.5), (2, 3.1), (1, 2.7)):  # growth did not help here
        f.observe(w, 1000, s)
    m = f.model()
    assert all(v >= 0 for v in (m.fixed_s, m.token_s, m.comm_s)) and len(f.samples) == 4
    assert m.seconds(2, 1000) >= 0.8 * m.seconds(1, 1000)  # the fit learned that more devices barely help
    before = f.model()
    for bad in ((0, 100, 1.0), (1, 100, -1.0), (1, 100, math.inf), (1, math.nan, 1.0)):
        f.observe(*bad)
    assert f.model() == before and len(f.samples) == 4


def test_a_prior_keeps_its_shape_and_a_fixed_one_is_never_refitted():
    prior = TrainTimeModel(fixed_s=1.0, token_s=0.01, comm_s=0.0, cross_node_s=5.0, node_size=8)
    f = TrainTimeFit(prior)
    f.observe(8, 800, 2 * prior.seconds(8, 800))  # twice as slow as the prior says, at one size
    assert f.model().seconds(16, 800) == pytest.approx(2 * (1.0 + 0.5) + 5.0 * 15 / 16)  # cross-node kept
    fixed = TrainTimeFit(prior, fixed=True)
    fixed.observe(8, 800, 123.0)
    assert fixed.model() is prior
    with pytest.raises(ValueError, match="window"):
        TrainTimeFit(window=0)
