"""The closed-form `summary` what-if against the reference `migrate` (real migration on clones)."""
import random

import pytest

from pivotrl.core.scheduler import ShiftAwareScheduler
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import Role, Sequence
from pivotrl.core.whatif import MigrateWhatIf, SummaryWhatIf, balanced_throughput

DENSE = ThroughputModel(A=3.2e-8, B=10.9e-3, C=0.139e-3, D=1.4e-3)
MOE = ThroughputModel(A=1.4e-8, B=10.9e-3, C=0.0235e-3, D=3.3e-3, moe_floor=0.0483, moe_k_over_e=1 / 16)


def state(seed, model, max_seqs=None):
    rng = random.Random(seed)
    R = rng.choice([2, 4, 8, 12])
    cap = rng.choice([150_000, 400_000, 1_300_000])
    per = rng.choice([8, 32, 64])
    s = ShiftAwareScheduler(Role.ROLLOUT, model, kv_reserve=rng.choice([0, 64]), max_num_seqs=max_seqs)
    s.add_replicas([(f"r{i}", cap) for i in range(R)])
    seqs = [Sequence(i, Role.ROLLOUT, rng.randint(50, 2000), generated=min(15000, int(rng.lognormvariate(6.5, 1.0))))
            for i in range(int(R * per * rng.choice([1.0, 1.5])))]
    s.submit(seqs)
    s.dispatch()
    return s, R, cap


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("max_seqs", [None, 40], ids=["nocap", "cap40"])
def test_summary_tracks_migration(seed, model, max_seqs):
    s, R, cap = state(seed, model, max_seqs)
    ex, su = MigrateWhatIf(s), SummaryWhatIf(s)
    assert su.now() == pytest.approx(ex.now())
    for k in sorted({1, max(1, R // 2), R}):
        for mig in (True, False):
            a, b = ex.after_shift_up(k, cap, mig), su.after_shift_up(k, cap, mig)
            assert b == pytest.approx(a, rel=0.10), (k, mig)
    for d in sorted({1, max(1, R // 2)}):
        ids = [f"r{i}" for i in range(d)]
        a, b = ex.after_shift_down(ids), su.after_shift_down(ids)
        assert b == pytest.approx(a, rel=0.10, abs=1e-9), d
    s.check_invariants()  # the what-ifs never touch the real scheduler


def test_zero_one_counts_busy_replicas():
    s = ShiftAwareScheduler(Role.REWARD, DENSE)
    s.add_replicas([("a", 10_000), ("b", 10_000), ("c", 10_000)])
    s.submit([Sequence(i, Role.REWARD, 100) for i in range(2)])
    s.dispatch()
    for W in (MigrateWhatIf(s, zero_one=True), SummaryWhatIf(s, zero_one=True)):
        assert W.now() == 2.0
        assert W.after_shift_up(2, 10_000, False) == 2.0  # queue empty: new replicas stay idle
        busy = [r for r in ("a", "b", "c") if s.replicas[r].n]
        assert W.after_shift_down(busy[:1]) == 2.0  # its sequence moves to the idle replica


def test_balanced_throughput_edges():
    assert balanced_throughput(DENSE, 0, 10, 1000) == 0.0
    assert balanced_throughput(DENSE, 4, 0, 0) == 0.0
    assert balanced_throughput(DENSE, 2, 4, 400) == pytest.approx(2 * DENSE.throughput(2, 200))


def test_empty_role_whatif():
    s = ShiftAwareScheduler(Role.ROLLOUT, DENSE)
    for W in (MigrateWhatIf(s), SummaryWhatIf(s)):
        assert W.now() == 0.0
        assert W.after_shift_up(3, 1000, True) == 0.0
        assert W.after_shift_down([]) == 0.0
