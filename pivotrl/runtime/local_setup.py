"""What a real run needs before its first event: models, data, devices, GPS, and the control env.

Owns: resolving the tiny models (the cached SFT bootstrap, or `models.*.hf_path`), the prompts as
token ids (`LocalPrompts`, the controller's `PromptSource`), the default device split per mode
when `deploy.allocation` is empty, the Ray cluster and device actors (through `cluster.py` and the
executor), registering the policy and the frozen GenRM in the GPS, the `ControlEnv` the
controller is built from, building requests / train batches / rewards for sample ids, held-out
accuracy, teardown, and the closing console table. `local.py` owns the loop itself.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivotrl.config.resolve import resolve
from pivotrl.core.throughput import ThroughputModel
from pivotrl.core.types import INFERENCE_ROLES, Role, Slot
from pivotrl.runtime.roles import RoleSpec

log = logging.getLogger(__name__)

#: A rough decode model of a tiny replica on one shared CPU core, used only until the online fit
#: has samples (measured once with the CPU engine: ~2-10 ms per iteration at small N).
PRIOR_MODEL = ThroughputModel(A=1e-6, B=0.004, C=0.0004, D=0.002)


@dataclass
class LocalPrompt:
    prompt_id: int
    batch: int
    prompt_len: int
    example: int


class LocalPrompts:
    """`PromptSource` over the training examples: batch `b` takes examples `b*P .. b*P+P-1` (cyclic)."""

    def __init__(self, prompt_ids: list[list[int]], per_batch: int) -> None:
        if not prompt_ids:
            raise ValueError("the training data has no prompts")
        self.ids = prompt_ids
        self.P = per_batch

    def example_of(self, batch: int, prompt_id: int) -> int:
        return (batch * self.P + prompt_id) % len(self.ids)

    def prompts(self, batch: int) -> list[LocalPrompt]:
        out = []
        for p in range(self.P):
            e = self.example_of(batch, p)
            out.append(LocalPrompt(p, batch, len(self.ids[e]), e))
        return out


class LocalSetup:
    """Models, data, devices and GPS of one real run. `accelerator` is `cpu` (local: gloo, CPU
    engine) or `cuda` (ray: NCCL, the engine `engine.name` names, normally vLLM): `cluster.accelerator`."""

    def __init__(self, cfg: Any, run_dir: Path) -> None:
        self.cfg, self.run_dir = cfg, Path(run_dir)
        self.r = r = resolve(cfg)
        self.accelerator = r.accelerator
        self.mode = r.mode
        self.num_devices = r.num_devices
        self.tp = {Role.ROLLOUT: r.tp["rollout"], Role.REWARD: r.tp["reward"]}
        if any(t != 1 for t in self.tp.values()):
            raise ValueError(f"the real runtimes host one engine per device actor (no tensor parallelism "
                             f"across actors yet): models.policy.tp and models.genrm.tp must be 1, got "
                             f"{self.tp[Role.ROLLOUT]}, {self.tp[Role.REWARD]}")
        self.P, self.G = r.prompts_per_step, r.group_size
        self.steps, self.warmup, self.staleness = r.steps, r.warmup, r.staleness
        self.allocation = {Role(k): v for k, v in r.allocation.items()}
        self.progress = bool(getattr(cfg.logging, "progress", False))
        self.cluster: Any = None
        self.executor: Any = None
        self.params: Any = None
        self.checkpoint_dir: Path | None = self.run_dir / "checkpoints"
        self.bootstrap_info: dict[str, Any] = {}
        self._pg_file = self.run_dir / f".pg_init_{os.getpid()}_{time.time_ns()}"
        self.resume_path: Path | None = None
        self.resume_version = 0

    # ------------------------------------------------------------------ start / stop
    def start(self) -> None:
        import torch
        from pivotrl.models.tokenizer import load_tokenizer
        from pivotrl.rl.data import load_examples
        from pivotrl.rl.rewards import RewardFunction
        from pivotrl.runtime.cluster import ClusterSpec, start_cluster
        from pivotrl.runtime.assets import load_assets, load_val_examples
        from pivotrl.runtime.executor import Executor, ParamSource

        torch.set_num_threads(1)
        assets = load_assets(self.cfg, progress=self.progress)
        self.policy_path, self.genrm_path = assets.policy_path, assets.genrm_path
        self.bootstrap_info = assets.bootstrap_info
        self.tok = load_tokenizer(self.policy_path)
        self.train_examples = load_examples(assets.train_path)
        self.val_examples = load_val_examples(assets.val_path, self.cfg.data.val_size)
        self.prompt_ids = [self._encode(e.prompt) for e in self.train_examples]
        self.source = LocalPrompts(self.prompt_ids, self.P)
        self.reward_fn = RewardFunction(self.cfg.reward)
        self.max_response = self.r.max_response

        self.params = ParamSource.create(self.cfg.cluster.gps)
        self.params.register_hf("policy", str(self.policy_path), frozen=False)
        self.params.register_hf("genrm", str(self.genrm_path), frozen=True)
        if bool(self.cfg.train.resume):
            self._find_checkpoint()
        self.cluster = start_cluster(ClusterSpec.from_config(self.cfg.cluster, self.num_devices))
        self.tau_shift = {r: float(self.cfg.cluster.tau_shift_prior_s) for r in (*INFERENCE_ROLES, Role.TRAIN)}
        self.executor = Executor(self.cluster, self.role_spec, self.params,
                                 {Role.ROLLOUT: "policy", Role.REWARD: "genrm"})
        self.executor.wait_ready()

    def _find_checkpoint(self) -> None:
        """`train.resume=true`: continue from the newest complete checkpoint in the run folder."""
        import json

        from pivotrl.engines.cpu_engine import load_hf_model
        from pivotrl.engines.trainer import latest_checkpoint

        ck = latest_checkpoint(self.checkpoint_dir)
        if ck is None:
            log.warning("train.resume=true but %s holds no complete checkpoint: starting fresh", self.checkpoint_dir)
            return
        k = int(json.loads((ck / "trainer_state.json").read_text())["version"])
        if k >= self.steps:
            raise ValueError(f"train.resume: checkpoint {ck} is at step {k}, train.steps={self.steps} leaves "
                             "nothing to run (raise train.steps)")
        self.params.restore("policy", load_hf_model(ck / "hf").state_dict(), k)
        self.resume_path, self.resume_version = ck, k

    def close(self) -> None:
        try:
            if self.executor is not None:
                self.executor.close()
        finally:
            try:
                if self.cluster is not None:
                    self.cluster.shutdown()
            finally:
                if self.params is not None:
                    self.params.close()
                self._pg_file.unlink(missing_ok=True)

    # ------------------------------------------------------------------ control env and roles
    def control_env(self) -> Any:
        from pivotrl.deploy import ControlEnv

        return ControlEnv(
            num_devices=self.num_devices, node_size=int(self.cfg.cluster.node_size), tp=dict(self.tp),
            models={r: PRIOR_MODEL for r in INFERENCE_ROLES}, tau_shift=self.tau_shift, prompts=self.source,
            prompts_per_step=self.P, group_size=self.G, steps=self.steps, staleness=self.staleness,
            allocation=dict(self.allocation), planner=self.r.planner, kv_reserve=0,
            kv_capacity={r: int(self.cfg.engine.kv_capacity_tokens) for r in INFERENCE_ROLES})

    def role_spec(self, slot: Slot, index: int) -> RoleSpec:
        if slot.role == Role.TRAIN:
            tcfg = self.r.trainer(self.cfg, slot.tp)
            return RoleSpec(Role.TRAIN, "policy", str(self.policy_path), trainer=tcfg, rank=index,
                            world_size=slot.tp, init_method=f"file://{self._pg_file}",
                            resume_from=str(self.resume_path) if self.resume_path else None)
        path = self.policy_path if slot.role == Role.ROLLOUT else self.genrm_path
        return RoleSpec(slot.role, "policy" if slot.role == Role.ROLLOUT else "genrm", str(path),
                        engine=self.cfg.engine)

    # ------------------------------------------------------------------ samples
    def _encode(self, messages: list[dict[str, str]], extra: int = 0) -> list[int]:
        """Chat-template ids; `extra` tokens of room beyond `data.max_prompt_length` (judge
        prompts carry the response and the judge template too)."""
        from pivotrl.runtime.evaluation import encode_prompt  # the one prompt encoding of the project

        return encode_prompt(self.tok, messages, self.cfg.data.max_prompt_length + extra)

    def batch_of(self, sid: int) -> int:
        return sid // (self.P * self.G)

    def example_of(self, sid: int) -> int:
        b, r = divmod(sid, self.P * self.G)
        return self.source.example_of(b, r // self.G)

    def request(self, role: Role, sid: int, generated: list[int], judge_ids: list[int] | None) -> Any:
        from pivotrl.engines.protocol import GenerationRequest, SamplingParams, logprobs_of

        if role == Role.ROLLOUT:
            params = SamplingParams(temperature=self.cfg.algo.rollout_temperature, max_tokens=self.max_response,
                                    seed=(int(self.cfg.seed) * 1_000_003 + sid) % (2**31))
            return GenerationRequest(sid, self.prompt_ids[self.example_of(sid)], params, generated=list(generated),
                                     generated_logprobs=logprobs_of(generated))
        if judge_ids is None:
            raise RuntimeError(f"reward sequence {sid} dispatched before its response finished")
        rc = self.cfg.reward
        params = SamplingParams(temperature=rc.genrm_temperature, max_tokens=rc.genrm_max_tokens)
        return GenerationRequest(sid, judge_ids, params, generated=list(generated),
                                 generated_logprobs=logprobs_of(generated))

    def _text(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True)

    def judge_prompt(self, sid: int, response_ids: list[int]) -> list[int]:
        from pivotrl.rl.genrm import judge_messages

        ex = self.train_examples[self.example_of(sid)]
        # room for the response (at most max_response tokens) and the judge template around it
        return self._encode(judge_messages(ex.prompt, self._text(response_ids)), extra=self.max_response + 64)

    def score(self, sid: int, response_ids: list[int], genrm_ids: list[int]) -> Any:
        ex = self.train_examples[self.example_of(sid)]
        return self.reward_fn(ex.data_source, self._text(response_ids), ex.ground_truth, ex.extra_info,
                              genrm_text=self._text(genrm_ids))

    def train_batch(self, ids: list[int], rewards: dict[int, float], responses: dict[int, list[int]],
                    versions: dict[int, int], logprobs: dict[int, list[float] | None] | None = None) -> Any:
        """The GRPO batch of samples `ids`. `logprobs[sid]` (the rollout engine's behaviour
        log-probs, one per response token) become `old_log_probs`, so the trainer's importance
        ratio corrects for staleness; if any sample lacks them the batch carries none (the trainer
        then recomputes them: ratio 1), never a mix."""
        from pivotrl.engines.trainer_worker import TrainBatch

        old = None
        if logprobs is not None and all(logprobs.get(s) is not None for s in ids):
            old = [[float(x) for x in logprobs[s]] for s in ids]
            for s, lp in zip(ids, old):
                if len(lp) != len(responses[s]):
                    raise ValueError(f"sample {s}: {len(lp)} behaviour log-probs for {len(responses[s])} "
                                     "response tokens")
        return TrainBatch(prompt_ids=[self.prompt_ids[self.example_of(s)] for s in ids],
                          response_ids=[list(responses[s]) for s in ids],
                          versions=[int(versions[s]) for s in ids],
                          rewards=[float(rewards[s]) for s in ids],
                          group_ids=[s // self.G for s in ids], old_log_probs=old)

    # ------------------------------------------------------------------ evaluation
    def val_accuracy(self, gps_model: str | None) -> dict[str, float]:
        """Held-out accuracy of the start policy (None) or of GPS's current `gps_model`: sampled at
        the rollout temperature (`data.val_samples` per prompt, the headline figure) and greedy,
        measured on a CPU engine in the driver (`runtime.evaluation`)."""
        import ray

        from pivotrl.config.engine import EngineConfig
        from pivotrl.engines.registry import create_engine
        from pivotrl.runtime.evaluation import evaluate

        eng = create_engine(self.policy_path, EngineConfig(name="cpu", num_threads=1))
        try:
            if gps_model is not None:
                ref, version = self.params.read(gps_model)
                eng.load_weights(ray.get(ref), version)
            d = self.cfg.data
            return evaluate(eng, self.tok, self.val_examples, temperature=self.cfg.algo.rollout_temperature,
                            samples=d.val_samples, seed=int(self.cfg.seed), max_prompt_len=d.max_prompt_length,
                            max_tokens=self.max_response)
        finally:
            eng.shutdown()


def print_summary_table(summary: dict[str, Any]) -> None:
    """The closing console table: throughput, accuracy before/after, shifts, time per role."""
    rows = [
        ("deploy / devices", f"{summary.get('deploy')} / {summary.get('devices')}"),
        ("steps (measured)", f"{summary.get('steps')} ({summary.get('measured_steps')})"),
        ("throughput tokens/s", f"{summary.get('throughput_tokens_per_s', 0.0):.1f}"),
        ("val accuracy before -> after",
         f"{summary.get('val_accuracy_before', float('nan')):.3f} -> {summary.get('val_accuracy_after', float('nan')):.3f}"),
        ("  greedy before -> after",
         f"{summary.get('val_accuracy_greedy_before', float('nan')):.3f} -> "
         f"{summary.get('val_accuracy_greedy_after', float('nan')):.3f}"),
        ("shifts", str(summary.get("num_shifts"))),
        ("tau_shift s (up+down)", ", ".join(f"{k}={v:.2f}" for k, v in (summary.get("tau_shift") or {}).items())),
        ("device-s held per role", ", ".join(f"{k}={v:.0f}" for k, v in
                                            (summary.get("device_seconds_by_role") or {}).items())),
        ("training step device-s", f"{summary.get('train_busy_device_s', 0.0):.1f}"),
        ("wall s", f"{summary.get('wall_s', 0.0):.1f}"),
    ]
    w = max(len(k) for k, _ in rows)
    print("-" * (w + 30))
    for k, v in rows:
        print(f"{k:<{w}}  {v}")
    print("-" * (w + 30), flush=True)
