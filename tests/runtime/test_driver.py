"""The device driver's handling of a finished shift, with stand-ins for the devices: a rollout
replica that read GPS while a publish committed a newer policy is refreshed before it serves."""
from __future__ import annotations

from pivotrl.core.types import Role, ShiftPlan, Slot
from pivotrl.deploy.events import ShiftDone
from pivotrl.runtime.driver import DeviceDriver
from pivotrl.runtime.ledger import SequenceLedger
from pivotrl.runtime.monitor import Monitor
from pivotrl.runtime.outcomes import ShiftResult


class _Params:
    def __init__(self, version):
        self.v = version

    def version(self, model):
        return self.v


class _Executor:
    def __init__(self, version):
        self.params, self.recoveries, self.published = _Params(version), [], 0

    def publish_policy(self):
        self.published += 1
        return self.params.v, [{"device": 0, "seconds": 0.01, "version": self.params.v}]


class _Training:
    def shifted(self, res):
        self.res = res


def _driver(version):
    d = DeviceDriver.__new__(DeviceDriver)
    d.ex, d.training, d.monitor, d.ledger = _Executor(version), _Training(), Monitor(), SequenceLedger()
    d.recorded_recoveries, d.events, d.t0 = [], [], 0.0
    d.record_event = lambda kind, **f: d.events.append((kind, f))
    return d


def _shift(loaded):
    res = ShiftResult(ShiftPlan(Role.ROLLOUT, up=[Slot(Role.ROLLOUT, 0, 1)]))
    res.timings = [{"device": 0, "role": "rollout", "direction": "up", "seconds": 0.1, "cold": False, "version": loaded}]
    return res


def test_a_rollout_shift_that_raced_a_publish_takes_the_new_policy_first():
    d = _driver(version=3)
    evs = list(d._on_result(_shift(loaded=2)))
    assert d.ex.published == 1 and [k for k, _ in d.events] == ["shift_timing", "weight_refresh"]
    assert isinstance(evs[-1], ShiftDone)  # the controller hears of the replica after its refresh
    fresh = _driver(version=3)
    list(fresh._on_result(_shift(loaded=3)))
    assert fresh.ex.published == 0


class _Samples:
    """Judge prompts by response text: responses 'a' and 'a' repeat one prompt; the score names
    the sample, so each sharer is seen scored against its own response."""

    def __init__(self, share):
        from pivotrl.runtime.samples import SharedJudgements

        self.shared = SharedJudgements(share)

    def batch_of(self, sid):
        return sid // 8

    def judge_prompt(self, sid, toks):
        return [100, *toks.ids]

    def score(self, sid, response, judgement):
        return (sid, tuple(response.ids), tuple(judgement.ids))


def _finish(d, role, sid, tokens):
    from pivotrl.engines.protocol import Completion

    d.ledger.place(role, sid, 0)
    (ev,) = d._complete(role, 0, Completion(sid, [1], tokens, "stop", 0, logprobs=[0.0] * len(tokens)))
    return ev


def test_a_repeated_judge_prompt_takes_the_first_ones_judgement():
    """Samples 1 and 2 repeat sample 0's response: 1 finishes while 0 is being judged and takes its
    judgement when it is done, 2 finishes after and takes it at once; both are scored against their
    own response and never run on the judge. Sample 3 differs; sample 9 (next batch) is judged itself."""
    d = _driver(version=0)
    d.s, d.r = _Samples(share=True), type("R", (), {"tp": {"rollout": 1, "reward": 1}})()
    assert _finish(d, Role.ROLLOUT, 0, [5, 6]).shares_judgement_of == -1
    assert _finish(d, Role.ROLLOUT, 1, [5, 6]).shares_judgement_of == 0
    assert 1 not in d.ledger.rewards
    assert _finish(d, Role.REWARD, 0, [7, 7, 7]).generated == 3
    assert d.ledger.rewards[1] == (1, (5, 6), (7, 7, 7)) and d.ledger.length(Role.REWARD, 1) == 3
    assert _finish(d, Role.ROLLOUT, 2, [5, 6]).shares_judgement_of == 0
    assert d.ledger.rewards[2] == (2, (5, 6), (7, 7, 7))
    assert _finish(d, Role.ROLLOUT, 3, [5]).shares_judgement_of == -1
    assert _finish(d, Role.ROLLOUT, 9, [5, 6]).shares_judgement_of == -1
    assert d.s.shared.close(0) == [[1, 0], [2, 0]]
    assert _finish(d, Role.ROLLOUT, 4, [5, 6]).shares_judgement_of == -1   # batch 0 trained: no match any more
    off = _driver(version=0)
    off.s, off.r = _Samples(share=False), d.r
    assert [_finish(off, Role.ROLLOUT, s, [5, 6]).shares_judgement_of for s in (0, 1)] == [-1, -1]


def test_a_written_step_leaves_the_ledger():
    """Once a batch's step row is written, the driver's ledger holds none of its samples (a long
    run's memory stays flat) and the next batch's stay."""
    from types import SimpleNamespace

    d = _driver(version=0)
    s = _Samples(share=True)
    s.prompt_len = lambda sid: 4
    s.reward_fn = SimpleNamespace(uses_genrm=True)
    s.parse_watch = SimpleNamespace(step=lambda step, failures, judged: failures / max(judged, 1))
    d.s, d.r = s, type("R", (), {"tp": {"rollout": 1, "reward": 1}})()
    for sid, resp in ((0, [5, 6]), (1, [5, 6]), (8, [9])):
        _finish(d, Role.ROLLOUT, sid, resp)
    _finish(d, Role.REWARD, 0, [7])
    _finish(d, Role.REWARD, 8, [7, 7])
    d.training = SimpleNamespace(take=lambda batch: ([1, 0], {}) if batch == 0 else ([], {}))
    d.stats = SimpleNamespace(step_fields=lambda **k: {"genrm_parse_failures": 0})
    d.ctrl = SimpleNamespace(tau_shift={}, sched={Role.ROLLOUT: None, Role.REWARD: None})
    d.monitor = SimpleNamespace(state=lambda role, sched: {})
    from pivotrl.deploy.events import StepDone

    d.step_fields(StepDone(1, 0, 1), now=1.0)
    (rec,) = [f for k, f in d.events if k == "sample_lengths"]
    assert rec["samples"] == [[0, 4, 2, 1], [1, 4, 2, 1]] and rec["shared"] == [[1, 0]]
    led = d.ledger
    assert set(led.responses) == set(led.rewards) == set(led.judge_ids) == {8}
    assert led.length(Role.REWARD, 0) == led.length(Role.REWARD, 1) == 0 and led.length(Role.REWARD, 8) == 2


def test_training_hands_over_each_batchs_ids_and_metrics_once(monkeypatch):
    """`TrainingSteps` keeps a trained batch's sample ids and step metrics until its row takes
    them (`take`, once), refuses a sample trained before, and counts every id for the summary."""
    from types import SimpleNamespace

    import pytest
    import ray

    from pivotrl.deploy.events import StartTraining
    from pivotrl.runtime.training import TrainingSteps

    monkeypatch.setattr(ray, "put", lambda batch: batch)  # no Ray session: the step is a stand-in
    led = SequenceLedger()
    samples = SimpleNamespace(train_batch=lambda ids, rewards, responses, versions: SimpleNamespace(old_log_probs=1))
    t = TrainingSteps(SimpleNamespace(train=SimpleNamespace(checkpoint_every=100)), None, samples, led, None,
                      SimpleNamespace(counts={}), lambda kind, **f: None)
    version = iter(range(1, 10))
    t._wait_checkpoint = t._save_state = t._publish = lambda *a: None
    t._step = lambda devices, ref: {"version": next(version), "loss": 0.5}
    for b, ids in ((0, [3, 1, 2]), (1, [4, 5])):
        for sid in ids:
            led.rewards[sid] = SimpleNamespace(total=1.0)
        t.run(StartTraining(b, b, ids, 10, (0,)))
    assert t.take(0) == ([3, 1, 2], {"version": 1, "loss": 0.5})
    assert t.take(0) == ([], {}) and t.take(1)[0] == [4, 5] and t.trained.count == t.trained.unique == 5
    with pytest.raises(RuntimeError, match=r"samples \[1\] would be trained twice"):
        t.run(StartTraining(2, 2, [1, 6], 10, (0,)))
    assert t.trained.count == 5 and t.take(2) == ([], {}), "a refused batch is neither counted nor trained"


def test_trained_once_refuses_repeats_across_and_within_batches():
    """`TrainedOnce`: ids marked one byte each (grown as ids grow), a repeat refused whether it
    was trained in an earlier batch or comes twice in one, and the refused batch not marked."""
    import pytest

    from pivotrl.runtime.training import TrainedOnce

    t = TrainedOnce()
    t.add([])
    t.add([0, 2, 1])
    t.add(range(3, 1000))
    assert t.count == t.unique == 1000
    with pytest.raises(RuntimeError, match=r"samples \[2, 5\] would be trained twice"):
        t.add([5, 1500, 2])
    with pytest.raises(RuntimeError, match=r"samples \[1001\] would be trained twice"):
        t.add([1001, 1002, 1001])
    with pytest.raises(ValueError, match="sample ids are >= 0, got -1"):
        t.add([-1])
    assert t.count == t.unique == 1000, "nothing of a refused batch counts"
    t.add([1500, 1001])
    assert t.count == t.unique == 1002
