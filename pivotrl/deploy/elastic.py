"""What the pivot controller tells the planner about a trainer that may grow (DESIGN §4.6).

Owns `elastic_sizes` (the world sizes a trainer may take: its home set grown by whole replica
blocks) and `ElasticTraining`, the controller's side of elastic training: it builds the planner's
`ElasticView` when a batch is ready (the sizes, the batch's tokens, the training-time model fitted
online from the steps, the measured reshard seconds, the inference work already released and its
tail, the run's tokens per second) and keeps the one estimate the planner cannot check itself,
the drain of the released work, honest online: every training decision predicts when the work
released then is done (its chosen candidate's `drain_s`), and once the last batch released then is
ready the measured/predicted ratio joins an exponential average (`drain_scale`, weight
`DRAIN_EMA`, clipped to [1/`DRAIN_CLIP`, `DRAIN_CLIP`]) that scales every later prediction. Like
the decode model's fit, it corrects what a model of lengths and speeds leaves out (here mostly the
tails of sequences still to be released, and replicas shared by many sequences). Pure: standard
library and numpy.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pivotrl.core.types import INFERENCE_ROLES, Role

if TYPE_CHECKING:
    from pivotrl.core.planner_types import Decision, ElasticView
    from pivotrl.deploy.pivot import PivotController

#: Draws of the in-flight sequences' lengths that estimate the tail of the released work.
TAIL_DRAWS = 16
#: Weight of a new measured/predicted drain ratio in `ElasticTraining.drain_scale`.
DRAIN_EMA = 0.5
#: `drain_scale` stays within [1/DRAIN_CLIP, DRAIN_CLIP] (one odd batch cannot blind the planner).
DRAIN_CLIP = 8.0


def elastic_sizes(num_devices: int, home: int, align: int, max_devices: int | None) -> tuple[int, ...]:
    """World sizes a trainer with a home set of `home` devices (the last ones) may take: the home
    set grown downwards by whole blocks of `align` devices, up to `max_devices` (None: all)."""
    top = min(num_devices, max_devices or num_devices)
    return tuple(range(home, top + 1, align)) if top >= home else (home,)


class ElasticTraining:
    """The pivot controller's elastic-training state (module docstring)."""

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.sizes = tuple(sizes)
        """World sizes training may take (the home size alone: elastic training off)."""
        self.drain_scale = 1.0
        self.drain_ratios: list[float] = []
        """Every measured/predicted drain ratio so far (for records and tests)."""
        self._probe: tuple[float, int, float] | None = None  # (decided at, last batch released, predicted s)

    @property
    def on(self) -> bool:
        return len(self.sizes) > 1

    # ------------------------------------------------------------------ the planner's view
    def view(self, ctrl: PivotController, now: float) -> ElasticView | None:
        """What the planner needs to price a bigger trainer (None: not now, or elastic off)."""
        from pivotrl.core.planner_types import ElasticView

        if not self.on or ctrl.training or not ctrl.pipe.train_ready():
            return None
        backlog, tail = self.backlog(ctrl)
        one = {r: ctrl.sched[r].throughput() / len(ctrl.active[r]) if ctrl.active[r] else 0.0 for r in INFERENCE_ROLES}
        return ElasticView(sizes=self.sizes, tokens=ctrl.pipe.ready_tokens(), model=ctrl.train_fit.model(),
                           reshard_s=ctrl.reshard_s, backlog=backlog, tail_s=tail, replica_throughput=one,
                           drain_scale=self.drain_scale, rate=ctrl.pipe.trained_tokens / now if now > 0 else 0.0)

    @staticmethod
    def backlog(ctrl: PivotController) -> tuple[dict[Role, float], dict[Role, float]]:
        """The inference work already released: per role its tokens still to generate, and its
        tail, the seconds its last sequence needs at one sequence's decode speed (no number of
        replicas shortens it). A sequence in flight with `g` tokens is expected to reach a length
        drawn from the finished sequences of its kind longer than `g` (the last `LENGTH_SAMPLE`;
        longer than all of them: `1.5 g`): its expected remaining tokens count into the backlog,
        and the tail is the mean over `TAIL_DRAWS` draws of the longest remaining one (the
        expected maximum, which the mean of each would understate). Reward also counts the
        judgements still to come of the responses in flight, after the responses' tail."""
        import numpy as np

        rng = np.random.default_rng(0)  # the same draws for the same state: decisions are reproducible
        tokens: dict[Role, float] = {}
        tail: dict[Role, float] = {}
        judge = np.zeros(0)
        for role, kind in ((Role.ROLLOUT, "response"), (Role.REWARD, "genrm")):
            s = ctrl.sched[role]
            seqs = [q for r in s.replicas.values() for q in r.running.values()] + s.queued_sequences()
            done = np.sort(np.asarray(ctrl.pipe.finished_lengths(kind), dtype=np.float64))
            if role == Role.REWARD:
                judge = done
            tokens[role], tail[role] = 0.0, 0.0
            if not seqs:
                continue
            g = np.asarray([q.generated for q in seqs], dtype=np.float64)
            i = np.searchsorted(done, g, side="right")
            longer = done.size - i
            suffix = np.concatenate([np.cumsum(done[::-1])[::-1], [0.0]])
            tokens[role] = float(np.where(longer > 0, suffix[i] / np.maximum(longer, 1) - g, 0.5 * g + 1.0).sum())
            pick = i[None, :] + (rng.random((TAIL_DRAWS, len(seqs))) * longer[None, :]).astype(np.int64)
            ends = np.where(longer[None, :] > 0, done[np.minimum(pick, max(done.size - 1, 0))] if done.size else 0.0,
                            1.5 * g[None, :] + 1.0)
            left = ends - g[None, :]
            j = left.argmax(axis=1)  # each draw's longest; timed at its sequence's own decode speed
            speed = np.asarray([max(s.model.throughput(1, seqs[k].length), 1e-9) for k in j])
            tail[role] = float((left[np.arange(TAIL_DRAWS), j] / speed).mean())
        in_flight = ctrl.sched[Role.ROLLOUT].num_sequences() + ctrl.held_judgements()
        if in_flight and judge.size:
            tokens[Role.REWARD] += float(judge.mean()) * in_flight
            longest = float(np.mean(rng.choice(judge, size=(TAIL_DRAWS, min(in_flight, judge.size))).max(axis=1)))
            one = max(ctrl.sched[Role.REWARD].model.throughput(1, int(longest)), 1e-9)
            tail[Role.REWARD] = max(tail[Role.REWARD], tail[Role.ROLLOUT] + longest / one)
        return tokens, tail

    # ------------------------------------------------------------------ the drain, checked
    def decided(self, decision: Decision, ctrl: PivotController) -> None:
        """A planner decision: if it priced training sizes, remember when it expects the work
        released now to be done (the chosen candidate's drain, before the scale it applied)."""
        if decision.role_up != Role.TRAIN or not decision.candidates or self._probe is not None:
            return
        chosen = decision.chosen
        pick = next((c for c in decision.candidates if chosen is not None and c.plan is chosen), None)
        if pick is None:  # kept its size: the candidate of the size it holds
            held = ctrl.train_slot.tp if ctrl.train_slot is not None else None
            pick = next((c for c in decision.candidates if c.k == held), None)
        drain = None if pick is None else pick.detail.get("drain_s")
        if drain is None or not math.isfinite(drain) or drain <= 0 or ctrl.pipe.next_release <= ctrl.pipe.version + 1:
            return  # nothing released beyond the batch about to train: no work to time
        self._probe = (decision.now, ctrl.pipe.next_release - 1, drain / self.drain_scale)

    def batch_ready(self, batch: int, now: float) -> None:
        """Batch `batch` has every reward: if it is the last one a prediction waited for, fold the
        measured/predicted ratio into `drain_scale`."""
        if self._probe is None or batch < self._probe[1]:
            return
        at, _, predicted = self._probe
        self._probe = None
        ratio = min(max((now - at) / predicted, 1.0 / DRAIN_CLIP), DRAIN_CLIP)
        self.drain_ratios.append(ratio)
        self.drain_scale = min(max((1 - DRAIN_EMA) * self.drain_scale + DRAIN_EMA * ratio, 1.0 / DRAIN_CLIP),
                               DRAIN_CLIP)

    def record(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "drain_scale": self.drain_scale, "drain_ratios": list(self.drain_ratios)}
