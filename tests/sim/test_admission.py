"""Admission like vLLM in a whole simulated run: the per-replica `max_num_seqs` cap holds on the
schedulers and the engines, a real waiting queue forms, the engines' KV stays within capacity
(preemption by recompute, counted), and pivot's tick rebalance carries out abort+assign moves."""
from __future__ import annotations

from pivotrl.core.types import INFERENCE_ROLES, Role
from pivotrl.deploy.events import Dispatch
from pivotrl.sim.runtime import SimDriver, SimSetup

SMALL = ["cluster.num_devices=8", "train.prompts_per_step=16", "train.group_size=4", "train.steps=3"]


def watched_run(cfg, alloc):
    rt = SimDriver(SimSetup.from_config(cfg, alloc))
    seen = {"queued": 0, "n": 0, "rebalance_moves": 0}
    inner = rt.ctrl.handle

    def handle(ev):
        out = inner(ev)
        for r in INFERENCE_ROLES:
            s = rt.ctrl.sched[r]
            seen["queued"] = max(seen["queued"], s.queued())
            seen["n"] = max([seen["n"]] + [rep.n for rep in s.replicas.values()])
        for rep in rt.replicas.values():
            seen["n"] = max(seen["n"], rep.n)
        if type(ev).__name__ == "Tick":  # rebalance moves come first, before any planner record
            for a in out:
                if not isinstance(a, Dispatch):
                    break
                seen["rebalance_moves"] += len(a.moves)
        return out

    rt.ctrl.handle = handle
    return rt.run(), seen


def test_cap_forms_a_queue_and_holds_everywhere(make_cfg):
    cfg = make_cfg("models=qwen1.5b_glm9b", "deploy=disaggregated", "models.sim.max_num_seqs=4",
                   "models.sim.reward_max_num_seqs=4", *SMALL)  # the rollout and the GenRM engines
    summary, seen = watched_run(cfg, {Role.ROLLOUT: 2, Role.REWARD: 2, Role.TRAIN: 4})
    assert seen["n"] == 4  # the cap is reached and never passed (schedulers and engines)
    assert seen["queued"] > 0  # 64 responses on 2 replicas x 4: a real waiting queue
    assert summary["measured_steps"] >= 1


def test_kv_full_preempts_and_stays_within_capacity(make_cfg):
    # a small memory share leaves the GenRM ~56K KV tokens (more than one sequence can reach):
    # growth overflows it and the engines preempt
    cfg = make_cfg("models=qwen1.5b_glm9b", "deploy=disaggregated", "models.sim.mem_util=0.22", *SMALL)
    summary, _ = watched_run(cfg, {Role.ROLLOUT: 2, Role.REWARD: 2, Role.TRAIN: 4})
    assert summary["kv_preemptions"] > 0
    assert max(summary["peak_kv_utilisation"].values()) <= 1.0 + 1e-6


def test_pivot_rebalances_on_ticks_only_when_enabled(make_cfg):
    # the group's own 32 devices and batch (on 8 devices the queue is never empty at a tick)
    on, seen_on = watched_run(make_cfg("models=qwen1.5b_glm9b", "deploy=pivot", "train.steps=2"), {Role.TRAIN: 16})
    off, seen_off = watched_run(make_cfg("models=qwen1.5b_glm9b", "deploy=pivot", "deploy.planner.rebalance=false",
                                         "train.steps=2"), {Role.TRAIN: 16})
    assert seen_off["rebalance_moves"] == 0
    assert seen_on["rebalance_moves"] > 0


def test_batch_barriers_hold_rollout_and_reward_back_until_the_batch_is_done(make_cfg):
    from pivotrl.core.types import Role as R

    cfg = make_cfg("models=qwen1.5b_glm9b", "deploy=disaggregated", "models.sim.rollout_batch_barrier=true",
                   "models.sim.reward_batch_barrier=true", *SMALL)
    rt = SimDriver(SimSetup.from_config(cfg, {R.ROLLOUT: 2, R.REWARD: 2, R.TRAIN: 4}))
    pipe, inner, seen = rt.ctrl.pipe, rt.ctrl.handle, {"reward": 0, "released": 0}

    def handle(ev):
        out = inner(ev)
        for a in out:
            if isinstance(a, Dispatch):
                for mv in a.moves:
                    b = pipe.batch_of(mv.seq_id)
                    if a.role == R.REWARD and mv.kind == "assign":
                        seen["reward"] += 1  # a judgement starts only once its batch's responses are all done
                        assert pipe.rollouts_complete(b) or b < pipe.version
                    if a.role == R.ROLLOUT and mv.kind == "assign" and b > 0:
                        seen["released"] += 1  # batch b starts only after batch b-1's responses
                        assert pipe.rollouts_complete(b - 1) or b - 1 < pipe.version
        return out

    rt.ctrl.handle = handle
    summary = rt.run()
    assert seen["reward"] > 0 and seen["released"] > 0 and summary["measured_steps"] >= 1
