"""Held-out accuracy through the cluster's own rollout engines, not an engine in the driver.

Owns:
- `RemoteEngine`: the `generate` that `runtime.evaluation` needs, on a device actor: submit the
  requests, then poll until every one of them finished. Bounded: a device that reports no new
  token and no completion for `idle_limit_s` raises, naming the device.
- `rollout_replica(executor, tp, slot=None)`: a rollout replica serving the policy's current
  version, for the time of a validation: one that serves already (the publish brings it to the
  current version first), else one shifted up for it on `slot` (the run passes the first rollout
  slot its controller will shift up, so that engine is the run's own) or, without one, the first
  aligned slot of the pool (whatever held those devices is shifted down; training offloads),
  shifted down again afterwards, so the controller finds the devices as they were (the engine
  stays dormant on the device, warm for the controller's shift up).
- `val_accuracy(cfg, resolved, executor, tok, val, slot=None)`: the two together with
  `evaluation.evaluate`.

Validation requests take sequence ids far above any run's (`evaluation`), so they never meet a
training sequence on a device. Knows nothing about the control plane: it uses the executor's
public calls.
"""
from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any, Iterator

from pivotrl.core.types import Role, ShiftPlan, Slot

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from pivotrl.config import PivotConfig
    from pivotrl.config.resolve import Resolved
    from pivotrl.engines.protocol import Completion, GenerationRequest
    from pivotrl.rl.data import Example
    from pivotrl.runtime.executor import Executor


class RemoteEngine:
    """`generate` on device actor `actor` (module docstring)."""

    def __init__(self, actor: Any, device: int, poll_s: float, idle_limit_s: float = 300.0) -> None:  # a Ray actor
        self.actor, self.device = actor, device
        self.poll_s, self.idle_limit_s = float(poll_s), float(idle_limit_s)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Completions of `requests`, in their order."""
        import ray

        requests = list(requests)
        want = {r.seq_id for r in requests}
        ray.get(self.actor.submit.remote(requests))
        done: dict[int, Completion] = {}
        last = time.monotonic()
        while len(done) < len(want):
            res = ray.get(self.actor.poll.remote(self.poll_s))
            if res.error is not None:
                raise RuntimeError(f"validation on device {self.device}: its engine failed ({res.error})")
            mine = [c for c in res.completions if c.seq_id in want]
            done.update((c.seq_id, c) for c in mine)
            if mine or any(sid in want for sid in res.progress):
                last = time.monotonic()
            elif time.monotonic() - last > self.idle_limit_s:
                raise RuntimeError(f"validation on device {self.device}: no token for {self.idle_limit_s:g}s "
                                   f"with {len(want) - len(done)} of {len(want)} requests unfinished")
        return [done[r.seq_id] for r in requests]


def _free_slot(ex: Executor, tp: int) -> Slot:
    n = len(ex.actors)
    for first in range(0, n - tp + 1, tp):
        slot = Slot(Role.ROLLOUT, first, tp)
        if not any(d in ex.retired for d in slot.devices):
            return slot
    raise RuntimeError(f"validation needs a rollout replica of {tp} device(s), but the pool has no such "
                       f"slot left (retired devices: {sorted(ex.retired)})")


@contextlib.contextmanager
def rollout_replica(ex: Executor, tp: int, slot: Slot | None = None) -> Iterator[tuple[Any, int]]:
    """(actor, device) of a rollout replica serving the policy's current version (module
    docstring): one serving already, else one shifted up on `slot` (a rollout slot of `tp`
    devices, none retired) or on the pool's first free aligned slot; raises the shift's own error
    if one had to be shifted up and could not be."""
    serving = [d for d, r in ex.serving().items() if r == Role.ROLLOUT]
    if serving:
        ex.publish_policy()  # a failed load replaces that device: look again
        serving = [d for d, r in ex.serving().items() if r == Role.ROLLOUT]
    if serving:
        yield ex.handle(serving[0])[0], serving[0]
        return
    if slot is None or any(d in ex.retired for d in slot.devices):
        slot = _free_slot(ex, tp)
    elif (slot.role, slot.tp) != (Role.ROLLOUT, tp):
        raise ValueError(f"validation needs a rollout slot of {tp} device(s), got {slot.slot_id}")
    down: dict[str, Slot] = {}
    for d in slot.devices:
        held = ex.hosted.get(d)
        if held is not None:
            down[held.slot_id] = held
        elif ex.role_of.get(d) is not None:  # a training rank (offloads) or a lone device
            s = Slot(ex.role_of[d], d, 1)
            down[s.slot_id] = s
    res = ex.run_shift(ShiftPlan(Role.ROLLOUT, up=[slot], down=list(down.values())))
    if res.error is not None:
        raise res.error
    try:
        yield ex.handle(slot.first_device)[0], slot.first_device
    finally:
        back = ex.run_shift(ShiftPlan(Role.ROLLOUT, down=[slot]))
        if back.error is not None:
            raise back.error


def val_accuracy(cfg: PivotConfig, r: Resolved, ex: Executor, tok: PreTrainedTokenizerBase, val: list[Example],
                 slot: Slot | None = None) -> dict[str, float]:
    """Held-out accuracy of the policy's current version, on a rollout replica of the cluster
    (`slot`: where to shift one up if none serves, as `rollout_replica`)."""
    from pivotrl.runtime.evaluation import evaluate

    with rollout_replica(ex, int(r.tp["rollout"]), slot) as (actor, device):
        d = cfg.data
        return evaluate(RemoteEngine(actor, device, float(cfg.cluster.poll_s)), tok, val,
                        temperature=cfg.algo.rollout_temperature, samples=d.val_samples, seed=int(cfg.seed),
                        max_prompt_len=d.max_prompt_length, max_tokens=r.max_response, chat=cfg.models.policy.chat)
