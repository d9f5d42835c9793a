"""What a real run needs before its first event: models, data, devices, GPS, and the control env.

Owns: resolving the tiny models (the cached SFT bootstrap, or `models.*.hf_path`), the prompts as
token ids (`LocalPrompts`, the controller's `PromptSource`), the default device split per mode
when `deploy.allocation` is empty, the Ray cluster and device actors (through `cluster.py` and the
executor), registering the policy and the frozen GenRM in the GPS, the `ControlEnv` the
controller is built from, building requests / train batches / rewards for sample ids, held-out
accuracy and teardown (the closing console table is `pivotrl.report.table`). `local.py` owns the loop itself.
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pivotrl.config.runtime import RuntimeConfig
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


def default_allocation(mode: str, n: int) -> dict[Role, int]:
    """Device split when `deploy.allocation` is empty (the sim sweeps instead; a real run cannot)."""
    tr = max(1, n // 4)
    if mode == "disaggregated":
        if n < 3:
            raise ValueError(f"deploy=disaggregated needs >= 3 devices (one per role), cluster.num_devices={n}")
        rm = max(1, n // 4)
        return {Role.ROLLOUT: n - rm - tr, Role.REWARD: rm, Role.TRAIN: tr}
    if mode == "rr_colocated":
        if n < 2:
            raise ValueError(f"deploy=rr_colocated needs >= 2 devices, cluster.num_devices={n}")
        return {Role.ROLLOUT: n - tr, Role.REWARD: 0, Role.TRAIN: tr}
    if mode == "pivot":
        return {Role.TRAIN: tr}
    return {}


class LocalSetup:
    """Models, data, devices and GPS of one real run. `accelerator` is `cpu` (local: gloo, CPU
    engine) or `cuda` (ray: NCCL, the engine `runtime.engine.name` names, normally vLLM)."""

    def __init__(self, cfg: Any, rt: RuntimeConfig, run_dir: Path, accelerator: str = "cpu") -> None:
        if accelerator not in ("cpu", "cuda"):
            raise ValueError(f"accelerator={accelerator!r}; allowed: cpu, cuda")
        self.cfg, self.rt, self.run_dir = cfg, rt, Path(run_dir)
        self.accelerator = accelerator
        self.mode = getattr(cfg.deploy.mode, "value", str(cfg.deploy.mode))
        self.num_devices = int(cfg.cluster.num_devices or cfg.models.devices)
        self.tp = {Role.ROLLOUT: int(cfg.models.policy.tp), Role.REWARD: int(cfg.models.genrm.tp)}
        if any(t != 1 for t in self.tp.values()):
            raise ValueError(f"the real runtimes host one engine per device actor (no tensor parallelism "
                             f"across actors yet): models.policy.tp and models.genrm.tp must be 1, got "
                             f"{self.tp[Role.ROLLOUT]}, {self.tp[Role.REWARD]}")
        self.P, self.G = int(cfg.train.prompts_per_step), int(cfg.train.group_size)
        self.steps = int(cfg.train.steps)
        self.warmup = min(int(cfg.train.warmup_steps), self.steps - 1)
        self.staleness = 0 if self.mode == "colocated" else int(cfg.deploy.staleness)
        a = cfg.deploy.allocation
        if a.given():
            self.allocation = {r: int(getattr(a, r.value) or 0) for r in (Role.ROLLOUT, Role.REWARD, Role.TRAIN)}
        else:
            self.allocation = default_allocation(self.mode, self.num_devices)
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
    def _models(self) -> tuple[Path, Path, Path, Path]:
        m = self.cfg.models
        if m.policy.hf_path and m.genrm.hf_path:
            data = self.rt.bootstrap.data
            if not (data.train_path and data.val_path):
                raise ValueError("models.*.hf_path is set: also set runtime.bootstrap.data.train_path/val_path")
            return Path(m.policy.hf_path), Path(m.genrm.hf_path), Path(data.train_path), Path(data.val_path)
        from pivotrl.models.bootstrap import bootstrap

        t0 = time.perf_counter()
        res = bootstrap(self.rt.bootstrap, cache_dir=self.rt.cache_dir, progress=self.progress)
        self.bootstrap_info = {"cached": res.cached, "seconds": time.perf_counter() - t0,
                               "policy_val_accuracy_greedy": res.report.get("policy_val_accuracy_greedy")}
        return res.policy_path, res.genrm_path, res.train_path, res.val_path

    def start(self) -> None:
        import torch
        from pivotrl.models.tokenizer import load_tokenizer
        from pivotrl.rl.data import load_examples
        from pivotrl.rl.rewards import RewardFunction
        from pivotrl.runtime.cluster import ClusterSpec, start_cluster
        from pivotrl.runtime.executor import Executor, ParamSource

        torch.set_num_threads(1)
        self.policy_path, self.genrm_path, train_path, val_path = self._models()
        self.tok = load_tokenizer(self.policy_path)
        self.train_examples = load_examples(train_path)
        self.val_examples = load_examples(val_path, limit=self.rt.val_size)
        self.prompt_ids = [self._encode(e.prompt) for e in self.train_examples]
        self.source = LocalPrompts(self.prompt_ids, self.P)
        self.reward_fn = RewardFunction(self.rt.reward)
        self.max_response = int(self.rt.max_response_tokens or self.rt.bootstrap.data.max_response_length)

        self.params = ParamSource.create(self.rt.gps)
        self.params.register_hf("policy", str(self.policy_path), frozen=False)
        self.params.register_hf("genrm", str(self.genrm_path), frozen=True)
        if bool(self.cfg.train.resume):
            self._find_checkpoint()
        self.cluster = start_cluster(ClusterSpec.from_config(self.cfg.cluster, self.num_devices))
        self.tau_shift = {r: float(self.rt.tau_shift_prior_s) for r in (*INFERENCE_ROLES, Role.TRAIN)}
        self.executor = Executor(self.cluster, self.role_spec, self.params,
                                 {Role.ROLLOUT: "policy", Role.REWARD: "genrm"}, self.tau_shift)
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
            allocation=dict(self.allocation), planner=self.cfg.deploy.planner, kv_reserve=0,
            kv_capacity={r: int(self.rt.engine.kv_capacity_tokens) for r in INFERENCE_ROLES})

    def train_world(self, slot: Slot) -> int:
        return slot.tp

    def role_spec(self, slot: Slot, index: int) -> RoleSpec:
        if slot.role == Role.TRAIN:
            from pivotrl.config.trainer import TrainerConfig

            tcfg = TrainerConfig(lr=self.rt.lr, micro_batch_size=self.rt.micro_batch_size,
                                 ppo_mini_batches=self.rt.ppo_mini_batches, ppo_epochs=self.rt.ppo_epochs,
                                 off_policy=self.rt.off_policy, lr_min_ratio=self.rt.lr_min_ratio,
                                 lr_decay_steps=(int(self.cfg.train.steps) if self.rt.lr_decay_steps is None
                                                 else self.rt.lr_decay_steps),
                                 staleness=self.staleness, world_size=slot.tp,
                                 backend="gloo" if self.accelerator == "cpu" else "nccl", device=self.accelerator,
                                 num_threads=int(self.cfg.cluster.threads_per_device), seed=int(self.cfg.seed),
                                 # The engines' log-prob convention (protocol docstring): T, or 1 for greedy.
                                 logprob_temperature=self.rt.rollout_temperature or 1.0)
            return RoleSpec(Role.TRAIN, "policy", str(self.policy_path), trainer=tcfg, rank=index,
                            world_size=slot.tp, init_method=f"file://{self._pg_file}",
                            resume_from=str(self.resume_path) if self.resume_path else None)
        path = self.policy_path if slot.role == Role.ROLLOUT else self.genrm_path
        return RoleSpec(slot.role, "policy" if slot.role == Role.ROLLOUT else "genrm", str(path),
                        engine=self.rt.engine)

    # ------------------------------------------------------------------ samples
    def _encode(self, messages: list[dict[str, str]], extra: int = 0) -> list[int]:
        """Chat-template ids; `extra` tokens of room beyond `data.max_prompt_length` (judge
        prompts carry the response and the judge template too)."""
        from pivotrl.rl.sync_loop import encode_prompt  # the one prompt encoding of the project

        return encode_prompt(self.tok, messages, self.rt.bootstrap.data.max_prompt_length + extra)

    def batch_of(self, sid: int) -> int:
        return sid // (self.P * self.G)

    def example_of(self, sid: int) -> int:
        b, r = divmod(sid, self.P * self.G)
        return self.source.example_of(b, r // self.G)

    def request(self, role: Role, sid: int, generated: list[int], judge_ids: list[int] | None) -> Any:
        from pivotrl.engines.protocol import GenerationRequest, SamplingParams, logprobs_of

        if role == Role.ROLLOUT:
            params = SamplingParams(temperature=self.rt.rollout_temperature, max_tokens=self.max_response,
                                    seed=(int(self.cfg.seed) * 1_000_003 + sid) % (2**31))
            return GenerationRequest(sid, self.prompt_ids[self.example_of(sid)], params, generated=list(generated),
                                     generated_logprobs=logprobs_of(generated))
        if judge_ids is None:
            raise RuntimeError(f"reward sequence {sid} dispatched before its response finished")
        rc = self.rt.reward
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
        the rollout temperature (`runtime.eval_samples` per prompt, the headline figure) and greedy,
        measured by the synchronous loop's own `evaluate` on a CPU engine in the driver."""
        import ray

        from pivotrl.config.engine import EngineConfig
        from pivotrl.config.rl import SyncLoopConfig
        from pivotrl.engines.registry import create_engine
        from pivotrl.rl.sync_loop import evaluate

        eng = create_engine(self.policy_path, EngineConfig(name="cpu", num_threads=1))
        try:
            if gps_model is not None:
                ref, version = self.params.read(gps_model)
                eng.load_weights(ray.get(ref), version)
            scfg = SyncLoopConfig(temperature=self.rt.rollout_temperature, eval_samples=self.rt.eval_samples,
                                  seed=int(self.cfg.seed))
            res = evaluate(eng, self.tok, self.val_examples, scfg, self.rt.bootstrap.data.max_prompt_length,
                           self.max_response)
        finally:
            eng.shutdown()
        return {"sampled": float(res["val_acc_sampled"]), "greedy": float(res["val_acc_greedy"])}

