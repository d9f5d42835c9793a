"""One rank of the FSDP2 GRPO trainer: the rank-local logic, whoever spawned the process.

Owns: the sharded policy (`fully_shard` per decoder layer, then the root), its AdamW optimizer,
the GRPO step (staleness filter, advantages, micro-batches, gradient accumulation, clipping), the
full state dict for publishing, offload/reload of device memory, and sharded checkpoints (written
in the background: `save_checkpoint(..., blocking=False)`, then `wait_checkpoint`).
Does not own processes: the caller initialises the default process group first (with
`init_process_group`, re-exported here, or its own), then builds a `TrainerWorker` and calls the
same method on every rank in the same order (every method is collective).
`pivotrl.trainer.trainer.Trainer` does that with spawned processes; a Ray actor per device can do
the same, one rank per actor.

Batch semantics are documented on `pivotrl.trainer.trainer.TrainBatch`; the step's arithmetic
lives in `pivotrl.rl.advantages` and `pivotrl.rl.losses`. CPU and GPU differ only in `device` and
the collective backend (gloo or NCCL). Checkpoints (`trainer_checkpoint.py`) need a folder every
rank can see. The memory-sane parts live beside it: `model_init.py` (meta-device init, rank-0
load), `logprobs.py` (the response tokens' log-probs, chunked or not), `batching.py` (token
micro-batches), `offload.py` (device storages to reused host buffers and back, allocator flush);
`weight_sync.publish_shards` writes a rank's shards to GPS.
"""
from __future__ import annotations

import math
import os
import random
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from pivotrl.config.trainer import TrainerSpec
from pivotrl.trainer import trainer_checkpoint
from pivotrl.trainer.batching import plan_micro_batches
from pivotrl.trainer.logprobs import padded_rows, token_log_probs
from pivotrl.trainer.model_init import build_sharded_model
from pivotrl.trainer.offload import StorageOffload
from pivotrl.trainer.state_store import read_state, write_state
# Re-exported: Ray actors import the batch type and the group launcher from here with the worker.
from pivotrl.trainer.dist import resolve_device
from pivotrl.trainer.train_batch import TrainBatch
from pivotrl.rl.advantages import compute_advantages
from pivotrl.rl.losses import policy_loss

if TYPE_CHECKING:
    from pivotrl.gps.store import GlobalParameterStore


def _storage_bytes(t: torch.Tensor) -> int:
    return t.untyped_storage().nbytes()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class TrainerWorker:
    """The rank-local trainer. Every public method is collective: call it on all ranks."""

    def __init__(self, cfg: TrainerSpec, model_path: str | os.PathLike, device: torch.device | str | None = None,
                 load_weights: bool = True):
        """`load_weights=False`: the policy's shards are allocated but not read from `model_path`;
        the caller fills the whole state next (`load_state`, elastic training)."""
        from transformers import AutoModelForCausalLM

        if not dist.is_initialized():
            raise RuntimeError("TrainerWorker needs an initialised default process group (see init_process_group)")
        cfg.validate()
        self.cfg = cfg
        self.model_path = Path(model_path)
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        kind, _ = resolve_device(cfg)
        if device is None:
            device = f"cuda:{torch.cuda.current_device()}" if kind == "cuda" else "cpu"
        self.device = torch.device(device)
        # Threads are the process owner's business (spawned rank, Ray actor, hosting caller); the
        # RNGs are seeded here because a rank's random streams are part of its checkpoint.
        self._seed_all(cfg.seed + self.rank)

        if not (self.model_path / "config.json").is_file():
            raise ValueError(f"model_path {str(self.model_path)!r} is not a Hugging Face model folder (no config.json)")
        self.model = self._load_sharded(AutoModelForCausalLM, load_weights=load_weights)
        self.model.train()
        self.hf_config = self.model.config
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=cfg.lr,
            betas=(cfg.adam_beta1, cfg.adam_beta2),
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
        )
        # The reference policy for the KL term: the initial weights, frozen, sharded the same way.
        self.ref_model = None
        if cfg.kl_coef > 0:
            self.ref_model = self._load_sharded(AutoModelForCausalLM, trainable=False)
            self.ref_model.eval().requires_grad_(False)

        self.version = 0  # policy version the current parameters represent; +1 per update
        self.counters = {"steps": 0, "samples_trained": 0, "samples_rejected_stale": 0, "tokens_trained": 0}
        self.state_meta: dict[str, Any] = {}
        """What the host-memory state carries besides tensors and this rank's own fields (every
        world size's RNG streams: `state_store`)."""
        self._offload = StorageOffload(self.device)
        # Asynchronous checkpoint writes, at most one in flight (`trainer_checkpoint.Checkpointer`).
        self._checkpoints = trainer_checkpoint.Checkpointer(timeout_s=cfg.timeout_s)

    # ----------------------------------------------------------------------------------- setup
    def _load_sharded(self, auto_cls: Any, trainable: bool = True, load_weights: bool = True) -> torch.nn.Module:
        cfg = self.cfg
        return build_sharded_model(
            auto_cls, self.model_path, self.device, world_size=self.world_size, param_dtype=cfg.param_dtype,
            init_on_meta=cfg.init_on_meta, gradient_checkpointing=cfg.gradient_checkpointing and trainable,
            hidden_head=cfg.logprob_chunk_tokens > 0, load_weights=load_weights)

    @staticmethod
    def _seed_all(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % 2**32)
        torch.manual_seed(seed)

    # ------------------------------------------------------------------------------ forward
    def _micro_batches(self, indices: np.ndarray, lengths: np.ndarray | None = None) -> list[np.ndarray]:
        """This rank's share of `indices`, cut into the same number of micro-batches on every rank
        (FSDP collectives must line up); a rank with less work gets empty micro-batches. By
        sequence count, or by padded tokens with `micro_batch_tokens` (`plan_micro_batches`)."""
        return plan_micro_batches(indices, self.world_size, self.rank, micro_batch_size=self.cfg.micro_batch_size,
                                  max_tokens=self.cfg.micro_batch_tokens, lengths=lengths)

    def _token_log_probs(self, model: torch.nn.Module, batch: TrainBatch, idx: list[int], entropy: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        return token_log_probs(model, batch, idx, self.device, temperature=self.cfg.logprob_temperature,
                               chunk_tokens=self.cfg.logprob_chunk_tokens, entropy=entropy)

    # --------------------------------------------------------------------------------- step
    def step(self, batch: TrainBatch) -> dict[str, float]:
        """One policy update on the fresh samples of `batch`; returns metrics (same on all ranks).

        The step trains the policy at version `self.version` and, if any sample is fresh enough,
        moves it to `self.version + 1`. A batch whose samples are all stale changes nothing and
        reports `trained = 0`."""
        self._require_loaded("step")
        t0 = time.perf_counter()
        cfg = self.cfg
        batch.validate(self.hf_config.vocab_size)
        versions = np.asarray(batch.versions, dtype=np.int64)
        if (versions > self.version).any():
            raise ValueError(
                f"TrainBatch.versions has version {int(versions.max())} > trainer version {self.version}"
            )
        if batch.advantages is not None:
            adv = np.asarray(batch.advantages, dtype=np.float32)
        else:
            adv = compute_advantages(
                cfg.advantage_estimator, batch.rewards, batch.group_ids, norm_by_std=cfg.norm_adv_by_std, eps=cfg.adv_eps
            )
        age = self.version - versions
        fresh = np.nonzero(age <= cfg.staleness)[0]
        n_rejected = len(batch) - len(fresh)
        self.counters["samples_rejected_stale"] += n_rejected
        metrics: dict[str, float] = {
            "samples_rejected_stale": float(n_rejected),
            "samples_rejected_stale_total": float(self.counters["samples_rejected_stale"]),
        }
        if batch.rewards is not None:
            metrics["reward_mean"] = float(np.mean(batch.rewards))
        if len(fresh) == 0:
            return {**metrics, "trained": 0.0, "samples_trained": 0.0, "version": float(self.version)}

        n_tok = sum(len(batch.response_ids[i]) for i in fresh)
        if n_tok == 0:
            raise ValueError("every fresh sample in TrainBatch.response_ids is empty: nothing to train on")
        lengths = np.asarray([len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)])
        minis = self._mini_batches(fresh)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.version)
        is_weights: list[np.ndarray | None] | None = None
        gap_sum = 0.0
        own = np.asarray([], dtype=np.int64)  # samples whose update's forward gives their proximal log-probs
        if cfg.off_policy == "decoupled" and batch.old_log_probs is not None:
            # Decoupled PPO: clip against the policy at the start of this step (proximal), and
            # correct for the behaviour policy with a truncated importance weight per token. With
            # one epoch, the first mini-batch's update runs at that very policy: its forward's own
            # log-probs (detached) are its proximal ones (`_update(own_proximal=True)`), so only the
            # later mini-batches are recomputed here (the recompute was ~30 % of a training step).
            own = self._own_proximal(minis)
            prox = self._all_log_probs(batch, skip=own)
            f64 = lambda x: np.asarray(x, dtype=np.float64)  # noqa: E731
            is_weights = [None if p is None else np.minimum(np.exp(f64(p) - f64(b)), cfg.behaviour_is_cap)
                          for p, b in zip(prox, batch.old_log_probs)]
            # mean |log pi_prox - log mu| per token: how far the engine's sampling log-probs are from
            # the trainer's (the IS mean is 1 in expectation whatever they are); on an on-policy
            # batch it is the engine-vs-trainer mismatch alone (numerics, or weights not loaded).
            # The own samples' part comes from their update's forward (the last of `_update`'s sums)
            gap_sum = float(sum(np.abs(f64(prox[i]) - f64(batch.old_log_probs[i])).sum()
                                for i in fresh if prox[i] is not None))
            # the own samples keep their behaviour log-probs: `_update` takes their proximal from its forward
            batch = batch.with_old_log_probs([b if p is None else p for p, b in zip(prox, batch.old_log_probs)])
        elif batch.old_log_probs is None and len(minis) * cfg.ppo_epochs > 1:
            # Several updates per batch: the ratio's denominator must be the policy before the
            # first of them, not the one each update starts from.
            batch = batch.with_old_log_probs(self._all_log_probs(batch))
        # loss, pg_loss, kl, then token-weighted clipfrac, approx_kl, ratio and entropy sums, then
        # the own-proximal samples' importance weight sum, truncated-token count and log-prob gap sum
        totals = torch.zeros(10, dtype=torch.float64)
        grad_norms: list[float] = []
        n_micro = 0
        for _ in range(cfg.ppo_epochs):
            for j, mini in enumerate(minis):
                reduced, grad_norm, k = self._update(batch, mini, adv, lengths, is_weights,
                                                     own_proximal=j == 0 and len(own) > 0)
                totals += reduced
                grad_norms.append(grad_norm)
                n_micro += k
        if is_weights is not None:
            w = [is_weights[i] for i in fresh if is_weights[i] is not None]
            w_sum = float(sum(x.sum() for x in w)) + float(totals[7])
            n_cap = float(sum((x >= cfg.behaviour_is_cap).sum() for x in w)) + float(totals[8])
            metrics["behaviour_is_mean"] = w_sum / n_tok  # n_tok > 0 was checked above
            metrics["behaviour_is_truncated"] = n_cap / n_tok
            metrics["behaviour_logprob_diff"] = (gap_sum + float(totals[9])) / n_tok
        n_updates = sum(math.isfinite(g) for g in grad_norms)
        stepped = n_updates > 0
        if stepped:
            self.version += 1
            self.counters["steps"] += 1
            self.counters["samples_trained"] += len(fresh)
            self.counters["tokens_trained"] += n_tok
        tok_seen = n_tok * cfg.ppo_epochs  # each token counted once per epoch in the sums
        metrics.update({
            "trained": float(stepped),
            "optimizer_steps": float(n_updates),
            "loss": float(totals[0]) / len(grad_norms),
            "pg_loss": float(totals[1]) / len(grad_norms),
            "clipfrac": float(totals[3]) / tok_seen,
            "approx_kl": float(totals[4]) / tok_seen,
            "ratio_mean": float(totals[5]) / tok_seen,
            "entropy": float(totals[6]) / tok_seen,
            "grad_norm": float(np.mean(grad_norms)),
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "samples_trained": float(len(fresh)),
            "tokens_trained": float(n_tok),
            "max_age_trained": float(age[fresh].max()),
            "adv_mean": float(adv[fresh].mean()),
            "adv_std": float(adv[fresh].std()),
            "micro_batches": float(n_micro),
            "version": float(self.version),
            "step_time_s": time.perf_counter() - t0,
        })
        if self.ref_model is not None:
            metrics["kl"] = float(totals[2]) / len(grad_norms)
        return metrics

    def lr_at(self, version: int) -> float:
        """Learning rate of the step that trains version `version` (config: lr_decay_steps,
        lr_min_ratio, lr_warmup_steps)."""
        cfg = self.cfg
        warm = min(1.0, (version + 1) / cfg.lr_warmup_steps) if cfg.lr_warmup_steps else 1.0
        frac = min(1.0, version / cfg.lr_decay_steps) if cfg.lr_decay_steps else 0.0
        return cfg.lr * warm * (1.0 - frac * (1.0 - cfg.lr_min_ratio))

    def _mini_batches(self, fresh: np.ndarray) -> list[np.ndarray]:
        """`fresh` cut into `ppo_mini_batches` mini-batches (whole GRPO groups stay together
        only by chance: advantages are computed on the whole batch first, so it does not matter).
        The order is shuffled with a generator seeded by (seed, version), the same on every rank."""
        k = min(self.cfg.ppo_mini_batches, len(fresh))
        if k == 1:
            return [fresh]
        order = np.random.default_rng((self.cfg.seed, self.version)).permutation(fresh)
        return [np.sort(part) for part in np.array_split(order, k)]

    def _own_proximal(self, minis: list[np.ndarray]) -> np.ndarray:
        """The samples whose proximal log-probs (decoupled PPO) their update's own forward gives:
        the first mini-batch's, when there is one epoch (a second epoch trains them again at a
        later policy, so they would need the values kept; recomputed then)."""
        return minis[0] if self.cfg.ppo_epochs == 1 else np.asarray([], dtype=np.int64)

    def _all_log_probs(self, batch: TrainBatch, skip: np.ndarray | None = None) -> list[list[float] | None]:
        """Per-token log-probs of every response under the current policy, on every rank (None
        for the samples in `skip`, the same on every rank)."""
        idx_all = np.arange(len(batch)) if skip is None else np.setdiff1d(np.arange(len(batch)), skip)
        if not len(idx_all):
            return [None] * len(batch)
        with torch.no_grad():
            out: dict[int, list[float]] = {}
            lengths = np.asarray([len(p) + len(r) for p, r in zip(batch.prompt_ids, batch.response_ids)])
            for mb in self._micro_batches(idx_all, lengths):
                real = len(mb) > 0
                idx = [int(i) for i in (mb if real else idx_all[:1])]
                logp, _, _ = self._token_log_probs(self.model, batch, idx)
                if real:
                    for b, i in enumerate(idx):
                        out[i] = logp[b, : len(batch.response_ids[i])].cpu().tolist()
            gathered: list[Any] = [None] * self.world_size
            dist.all_gather_object(gathered, out)
        merged = {k: v for part in gathered for k, v in part.items()}
        return [merged.get(i) for i in range(len(batch))]

    def _update(self, batch: TrainBatch, mini: np.ndarray, adv: np.ndarray, lengths: np.ndarray,
                is_weights: list[np.ndarray | None] | None = None, own_proximal: bool = False
                ) -> tuple[torch.Tensor, float, int]:
        """One optimizer step on the samples `mini` (gradient accumulated over micro-batches);
        returns the all-reduced metric sums, the global grad norm (inf/nan: step skipped) and
        the number of micro-batches. `is_weights` (decoupled PPO) scale each token's advantage.
        `own_proximal` (decoupled PPO, the step's first update): `batch.old_log_probs` of `mini`
        are the behaviour's; the proximal log-probs are this forward's own, detached, and the
        importance weights come from them (their sum, truncated count and summed |log-prob gap|:
        the last three sums)."""
        cfg = self.cfg
        n_tok = sum(len(batch.response_ids[i]) for i in mini)
        n_seq = sum(1 for i in mini if len(batch.response_ids[i]) > 0)
        denom = float(n_tok if cfg.loss_agg_mode == "token-mean" else n_seq)
        micro = self._micro_batches(mini, lengths)
        self.optimizer.zero_grad(set_to_none=True)  # a step that raised half-way left gradients
        sums = torch.zeros(10, dtype=torch.float64)
        for k, mb in enumerate(micro):
            weight = 1.0
            if len(mb) == 0 or denom == 0:  # keep collectives aligned: run a real sample with zero weight
                mb, weight = mini[:1], 0.0
            idx = [int(i) for i in mb]
            self.model.set_requires_gradient_sync(k == len(micro) - 1)
            logp, mask, ent = self._token_log_probs(self.model, batch, idx, entropy=True)
            mask = mask * weight
            rows = None if batch.old_log_probs is None else padded_rows(
                [batch.old_log_probs[i] for i in idx], logp.shape[1], self.device)
            old = logp.detach() if rows is None or own_proximal else rows
            ref = None
            if self.ref_model is not None:
                with torch.no_grad():
                    ref, _, _ = self._token_log_probs(self.ref_model, batch, idx)
            adv_t = torch.as_tensor(adv[idx], device=self.device)
            w_own = torch.zeros(3, dtype=torch.float64)
            if own_proximal:  # rows: the behaviour's log-probs
                w = torch.clamp(torch.exp(old - rows), max=cfg.behaviour_is_cap)
                adv_t = adv_t[:, None] * w
                w_own = torch.stack([(w * mask).sum(), ((w >= cfg.behaviour_is_cap) * mask).sum(),
                                     ((old - rows).abs() * mask).sum()]).double()
            elif is_weights is not None:
                adv_t = adv_t[:, None] * padded_rows([is_weights[i].tolist() for i in idx], logp.shape[1], self.device)
            loss, m = policy_loss(
                cfg.loss, logp, old, adv_t, mask,
                clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high,
                agg_mode=cfg.loss_agg_mode, denominator=max(denom, 1.0),
                ref_log_probs=ref, kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator,
            )
            # FSDP averages gradients over ranks; each rank's loss is already a share of the
            # global mean, so scale by world size to get the gradient of the global loss.
            (loss * self.world_size).backward()
            ntok = float(mask.sum())
            sums += torch.tensor([
                float(loss.detach()), float(m["pg_loss"]), float(m.get("kl", 0.0)),
                float(m["clipfrac"]) * ntok, float(m["approx_kl"]) * ntok, float(m["ratio_mean"]) * ntok,
                float((ent * weight).sum()), float(w_own[0]), float(w_own[1]), float(w_own[2]),
            ], dtype=torch.float64)
        reduced = sums.to(self.device)
        dist.all_reduce(reduced)
        max_norm = cfg.grad_clip if cfg.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)
        grad_norm = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        if math.isfinite(grad_norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return reduced.cpu(), grad_norm, len(micro)

    @torch.no_grad()
    def compute_log_probs(self, batch: TrainBatch) -> list[list[float]] | None:
        """Per-token log-probs of every response under the current policy (rank 0 gets them;
        other ranks get None). Useful as `old_log_probs` or to check a rollout engine."""
        self._require_loaded("compute_log_probs")
        out = self._all_log_probs(batch)
        self.model.reshard()  # FSDP2 keeps the root gathered after a no-grad forward; free it
        return out if self.rank == 0 else None

    # -------------------------------------------------------------------- publish / state
    def full_state_dict(self, dtype: str | None = None) -> dict[str, torch.Tensor] | None:
        """The full (unsharded) policy on CPU with Hugging Face names, in `dtype` (default
        `algo.publish_dtype`: the GPS store's dtype); rank 0 only (None elsewhere)."""
        self._require_loaded("full_state_dict")
        want = getattr(torch, dtype or self.cfg.publish_dtype)
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        # One host copy: the cast is the copy (a same-dtype `to` would alias the gathered tensor).
        return {k: (v.detach().to(want) if v.dtype != want else v.detach().clone()) for k, v in sd.items()}

    def state(self) -> dict[str, Any]:
        return {"version": self.version, "counters": dict(self.counters), "world_size": self.world_size}

    def save_state(self, store: GlobalParameterStore, name: str) -> dict[str, float]:
        """Write the whole state (weights, AdamW moments and step, version, counters, RNG) into GPS
        model `name` of `store`, each rank its own rows (`state_store.write_state`). Collective."""
        self._require_loaded("save_state")
        return write_state(self, store, name)

    def load_state(self, store: GlobalParameterStore, name: str) -> dict[str, float]:
        """Take the whole state from GPS model `name` of `store`, whatever world size wrote it
        (`state_store.read_state`). Collective."""
        self._require_loaded("load_state")
        return read_state(self, store, name)

    # --------------------------------------------------------------------- offload / reload
    def offloadable(self) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) of every tensor whose storage lives on the training device: sharded
        params, grads, optimizer state (and the frozen reference). Storages are what get freed,
        so views share the fate of their base (FSDP2's sharded param views included). The names
        key the reused host buffers."""
        out: list[tuple[str, torch.Tensor]] = []
        names: dict[int, str] = {}
        for tag, model in (("policy", self.model), ("ref", self.ref_model)):
            if model is None:
                continue
            for n, p in model.named_parameters():
                names[id(p)] = f"{tag}.{n}"
                out.append((f"{tag}.{n}", _local(p.data)))
                if p.grad is not None:
                    out.append((f"{tag}.{n}.grad", _local(p.grad)))
        for p, st in self.optimizer.state.items():
            out.extend((f"{names.get(id(p), id(p))}.optim.{k}", _local(v)) for k, v in st.items() if torch.is_tensor(v))
        return out

    def device_bytes(self) -> dict[str, int]:
        """Bytes this rank holds in the storages of params, grads and optimizer state now."""
        params = sum(_storage_bytes(_local(p.data)) for p in self.model.parameters())
        grads = sum(_storage_bytes(_local(p.grad)) for p in self.model.parameters() if p.grad is not None)
        optim = sum(
            _storage_bytes(_local(v)) for st in self.optimizer.state.values() for v in st.values() if torch.is_tensor(v)
        )
        return {"params": params, "grads": grads, "optimizer": optim}

    def offload(self) -> dict[str, float]:
        """Copy every device storage of params, grads and optimizer state to host memory (pinned
        on CUDA, buffers reused from the last offload), free the device storages (resize to 0
        bytes), drop FSDP's gathered copies, and empty the CUDA allocator's cache, ahead of a
        role shift. Metrics: bytes, seconds, host buffers newly allocated, cache emptied (0/1).
        A checkpoint write in flight goes on: it reads only its own staged host copy."""
        if self._offload.active:
            return {"offloaded_bytes": 0.0, "offload_s": 0.0, "host_allocations": 0.0, "cache_emptied": 0.0}
        t0 = time.perf_counter()
        for model in (self.model, self.ref_model):
            if model is not None:
                model.reshard()  # no-grad forwards leave the root's parameters gathered
        out = self._offload.offload(self.offloadable())
        out["offload_s"] = time.perf_counter() - t0
        return out

    def reload(self) -> dict[str, float]:
        """Reallocate the freed device storages and copy the host copies back, bit for bit. The
        host buffers stay allocated for the next offload."""
        return self._offload.reload()

    @property
    def offloaded(self) -> bool:
        return self._offload.active

    def _require_loaded(self, what: str) -> None:
        if self._offload.active:
            raise RuntimeError(f"trainer state is offloaded to host memory; call reload() before {what}()")

    # -------------------------------------------------------------------------- checkpoints
    def save_checkpoint(self, path: str | os.PathLike, extra: dict[str, Any] | None = None, *,
                        blocking: bool = True) -> str | None:
        """Write a checkpoint into the (empty, new or stale) folder `path` (`trainer_checkpoint`
        says what goes where). Collective. Waits for the previous save first, raising its failure
        (`CheckpointError`) instead of starting. `blocking=True` returns the folder once the
        checkpoint is complete; `blocking=False` returns None as soon as the state is staged in
        host memory: the write goes on in the background, while `step`, `offload` and the rest
        run (they do not change what is written); `wait_checkpoint` ends it."""
        self._require_loaded("save_checkpoint")
        self._checkpoints.start(self, Path(path), extra, stage=not blocking)
        return self._checkpoints.wait() if blocking else None

    def wait_checkpoint(self, timeout_s: float | None = None) -> str | None:
        """Block until the save in flight is complete (`trainer_state.json` written, every rank
        done); return its folder, or None if none was in flight. Raises `CheckpointError` naming
        the folder if it failed (same on every rank), `TimeoutError` after `timeout_s` (default
        `algo.timeout_s`). Local: no collective on the training group."""
        return self._checkpoints.wait(timeout_s)

    def checkpoint_pending(self) -> str | None:
        """The folder of the save started and not yet waited for (running or done), or None. Local."""
        return self._checkpoints.pending()

    def load_checkpoint(self, path: str | os.PathLike) -> dict[str, Any]:
        """Restore model, optimizer, version, counters and RNG from `path`; return its extra state
        (`trainer_checkpoint.load`). Collective. A save in flight is waited for first."""
        self._require_loaded("load_checkpoint")
        self._checkpoints.wait()
        return trainer_checkpoint.load(self, Path(path))

    def close(self, wait: bool = True) -> None:
        """Finish the save in flight (raising its failure) and release the checkpoint process
        group; call it before destroying the default process group (that would break the write).
        `wait=False` when a peer rank died: return at once, abandoning an unfinished write (it is
        never marked complete). The worker takes no checkpoint calls after."""
        self._checkpoints.close(wait)
