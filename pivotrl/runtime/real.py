"""`cluster=local` and `cluster=ray`: real RL on real devices, driven by the same controllers,
schedulers and planner as the simulator, through the same runtime loop.

`run_real` wires the pieces and always tears down: assets (checkpoints, data), samples, the
launched devices, the controller (resumed at a checkpoint's version), the device driver, the loop
and the recorder; held-out accuracy before and after, on a rollout replica of the cluster
(`validation.py`; the closing table is `pivotrl.run`'s). The two cluster kinds differ only in how
the devices are launched (`launch.py`, `cluster.py`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pivotrl.config.resolve import resolve
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import INFERENCE_ROLES, Role

#: Seconds between `role_load` records (the trace's per-role counters) on real devices.
LOAD_EVERY_S = 1.0

#: A rough decode model of a tiny replica on one shared CPU core, used only until the online fit
#: has samples (measured once with the CPU engine: ~2-10 ms per iteration at small N).
PRIOR_MODEL = ThroughputModel(A=1e-6, B=0.004, C=0.0004, D=0.002)

if TYPE_CHECKING:
    from pivotrl.config import PivotConfig
    from pivotrl.config.resolve import Resolved
    from pivotrl.deploy import ControlEnv
    from pivotrl.deploy.pipeline import PromptSource
    from pivotrl.logging.tracker import Tracker


def control_env(cfg: PivotConfig, r: Resolved, source: PromptSource) -> ControlEnv:
    """The controller's construction values of a real run."""
    from pivotrl.deploy import ControlEnv

    tp = {Role.ROLLOUT: r.tp["rollout"], Role.REWARD: r.tp["reward"]}
    return ControlEnv(
        num_devices=r.num_devices, node_size=r.node_size, tp=tp, models={x: PRIOR_MODEL for x in INFERENCE_ROLES},
        tau_shift={x: float(cfg.cluster.tau_shift_prior_s) for x in (*INFERENCE_ROLES, Role.TRAIN)},
        prompts=source, prompts_per_step=r.prompts_per_step, group_size=r.group_size, steps=r.steps,
        staleness=r.staleness, allocation={Role(k): v for k, v in r.allocation.items()}, planner=r.planner,
        kv_reserve=0, kv_capacity={x: int(r.engine(cfg, x.value).settings.kv_capacity_tokens) for x in INFERENCE_ROLES},
        max_num_seqs={x: int(r.engine(cfg, x.value).settings.max_num_seqs) for x in INFERENCE_ROLES})


def check_kv_capacity(cfg: PivotConfig, judge_room: int) -> None:
    """Refuse an engine KV budget that cannot hold one request of each role: a sequence that fits
    no replica would wait forever. The policy's longest request is a prompt plus its response cap;
    the GenRM's is its judge prompt (prompt, response and `judge_room`, the judge template's tokens
    measured with the GenRM's tokenizer: `samples.judge_template_tokens`) plus its output cap. Only
    the project's CPU engine has a configured budget (`engine.kv_capacity_tokens`); vLLM sizes its
    cache from device memory and reports it."""
    from pivotrl.config.base import ConfigError

    d, j = cfg.data, cfg.models.genrm.judge
    policy = int(d.max_prompt_length) + int(d.max_response_length)
    judge = policy + int(judge_room) + int(j.max_tokens)
    need = {"rollout": (policy, f"data.max_prompt_length={d.max_prompt_length} + data.max_response_length="
                                f"{d.max_response_length} = {policy} tokens"),
            "reward": (judge, f"its judge prompt (data.max_prompt_length + data.max_response_length + "
                              f"{judge_room} tokens of the judge template {j.template!r}, measured with the "
                              f"GenRM's tokenizer) + models.genrm.judge.max_tokens={j.max_tokens} = {judge} tokens")}
    for role, (n, why) in need.items():
        settings = cfg.engine.for_role(role)
        cap, key = int(settings.kv_capacity_tokens), cfg.engine.key_of(role, "kv_capacity_tokens")
        if settings.name == "cpu" and cap < n:
            # a value both roles take from one key must hold the larger of their requests
            most = max(m for r, (m, _) in need.items() if cfg.engine.key_of(r, "kv_capacity_tokens") == key)
            raise ConfigError("kv_capacity_tokens", f">= {most}: one {role} request needs {why}, "
                              f"more than the {cap} tokens of KV one replica holds", cap, key)


def check_tensor_parallel(cfg: PivotConfig) -> None:
    """A replica of several devices needs an engine that runs tensor parallelism (vLLM): the
    project's CPU engine hosts one device per replica."""
    from pivotrl.config.base import ConfigError
    from pivotrl.engines.registry import resolve_engine_name

    for role, model in (("rollout", "policy"), ("reward", "genrm")):
        name = cfg.engine.for_role(role).name
        engine = resolve_engine_name(name)
        tp = int(getattr(cfg.models, model).tp)
        if tp > 1 and engine != "vllm":
            raise ConfigError("tp", f"1 with engine.name={name!r} for {role} (its engine, {engine!r}, runs one "
                              f"device per replica); a replica of several devices needs engine=vllm", tp,
                              f"models.{model}")


def _record_validation(tracker: Tracker | None, which: str, now: float, seconds: float, acc: dict[str, float]) -> None:
    """A `validation` timeline record: held-out accuracy `which` (before/after) the run, ending at
    `now` on the run's clock (a span in the run's trace)."""
    if tracker is not None:
        tracker.log_event("validation", now=now, which=which, seconds=seconds, accuracy=acc["sampled"],
                          greedy=acc["greedy"])


def run_real(cfg: PivotConfig, run_dir: Path, tracker: Tracker | None) -> dict[str, Any]:
    """Validate, run the RL loop on real devices, validate again; always tear down."""
    import torch

    from pivotrl.deploy import make_controller
    from pivotrl.runtime.assets import load_assets
    from pivotrl.runtime.driver import DeviceDriver
    from pivotrl.runtime.launch import Launch
    from pivotrl.runtime.loop import RunLoop
    from pivotrl.runtime.recorder import Recorder
    from pivotrl.runtime.samples import Samples
    from pivotrl.runtime.validation import val_accuracy

    r = resolve(cfg)
    check_tensor_parallel(cfg)
    progress = bool(cfg.logging.progress)
    torch.set_num_threads(1)
    assets = load_assets(cfg, progress=progress)
    tok, genrm_tok = assets.tokenizers(cfg)
    train, val = assets.examples(cfg, tok)
    samples = Samples(cfg, tok, genrm_tok, train, r.prompts_per_step, r.group_size, r.max_response)
    check_kv_capacity(cfg, samples.judge_room)  # the judge template measured; before Ray starts
    from pivotrl.logging.teardown import close_all

    launch = Launch(cfg, r, assets.policy_path, assets.genrm_path, run_dir)
    error: BaseException | None = None
    try:
        launch.start()
        ctrl = make_controller(cfg.deploy.mode, control_env(cfg, r, samples.source))
        if launch.groups.off is not None:  # elastic training asked for, its state has no room: said in the log
            ctrl.disable_elastic()
            if tracker is not None:
                tracker.log_event("elastic_training_off", now=0.0, why=launch.groups.off)
        # on the first rollout slot the controller shifts up: that engine is then the run's own
        first = next((s for p in ctrl.initial_plans() for s in p.up if s.role == Role.ROLLOUT), None)
        t0 = time.perf_counter()
        before = val_accuracy(cfg, r, launch.executor, tok, val, first)
        val_s = time.perf_counter() - t0
        if launch.resume_version:
            ctrl.resume(launch.resume_version)
            if tracker is not None:
                tracker.log_event("resume", now=0.0, version=launch.resume_version, checkpoint=str(launch.resume_path))
        _record_validation(tracker, "before", 0.0, val_s, before)  # it ended as the run's clock starts
        driver = DeviceDriver(cfg, r, ctrl, launch, samples, tracker)
        rec = Recorder(tracker, mode=ctrl.name, models=cfg.models.name, runtime=r.runtime, devices=r.num_devices,
                       steps=r.steps, warmup=r.warmup, prompts_per_step=r.prompts_per_step, group_size=r.group_size,
                       console=f"pivotrl {r.runtime} {ctrl.name}" if progress else None, load_every_s=LOAD_EVERY_S)
        summary = {"val_accuracy_before": before["sampled"], "val_accuracy_greedy_before": before["greedy"]}
        summary.update(RunLoop(ctrl, driver, rec).run())
        t0 = time.perf_counter()
        after = val_accuracy(cfg, r, launch.executor, tok, val)
        _record_validation(tracker, "after", driver.now, time.perf_counter() - t0, after)
        summary.update(val_accuracy_after=after["sampled"], val_accuracy_greedy_after=after["greedy"],
                       bootstrap=assets.bootstrap_info)
        return summary  # pivotrl.run prints the closing table (pivotrl.report.table)
    except BaseException as e:
        error = e
        raise
    finally:  # the run's own error stays the one raised; a teardown error is logged after it
        close_all(error, [("shutting down the devices and Ray", launch.close)])
