"""Peak device memory of one trainer rank, by arithmetic, and the start-up check that uses it.

Pure Python (no torch): the control plane and config validation may call it. Owns `ModelShape`
(the few numbers of a decoder-only model that memory depends on, from a Hugging Face
`config.json` dict), `estimate_train_memory` (the peak bytes per rank of one FSDP2 training step,
broken into parts), `check_fits` and `ModelDoesNotFitError`.

The arithmetic (bytes; P parameters, W ranks, c = bytes of the compute dtype: 2 for bf16, 4 for
fp32; T tokens of the largest micro-batch, padded; R of them response tokens; H hidden, I MLP
width, Hkv = kv_heads x head_dim, V vocabulary, C = logprob_chunk_tokens):

- sharded state, always resident: fp32 master weights 4P/W, fp32 gradients 4P/W, AdamW moments
  8P/W = 16P/W.
- gathered parameters: the root unit (embedding, LM head if untied, final norm) stays gathered
  for the whole forward and backward (FSDP2 does not reshard the root after forward): c P_root;
  plus two decoder layers in flight (current and prefetched): 2 c P_layer.
- saved activations per token per layer, counted from what autograd keeps in Hugging Face's
  Qwen2 layer (two RMSNorms save an fp32 input and a cast output: 2 (4 + c) H; q/k/v after
  rotary and the attention output: c (2H + 2Hkv); the o_proj input: c H; SwiGLU gate, silu(gate),
  up and their product: 4 c I): A = (8 + 5c) H + 2c Hkv + 4c I. Without gradient checkpointing
  every layer keeps A per token; with it, each layer keeps its input (c H) and one layer at a
  time holds A again during its recompute, plus about as much again for its gradients.
- log-probs: chunked, one chunk of C rows holds its logits (c), the float32 copy and log-softmax
  (4 + 4) and their gradients (4 + 4): C V (c + 16). The original path keeps the logits of all T
  positions (c T V) and R V (c + 16) for the response rows.
- unsharded gradients in flight: one unit's compute-dtype gradient plus its fp32 copy for the
  reduce-scatter, (c + 4) P_unit; at the end of backward this is the root's.
- the AdamW step (foreach) makes about two fp32 temporaries per shard: 8P/W.

The peak is the largest of three phases (forward/backward, end of backward, optimizer step), not
their sum. It leaves out the CUDA context, NCCL buffers and allocator fragmentation: `check_fits`
keeps `reserve_fraction` of each device for those.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["ModelShape", "MemoryEstimate", "ModelDoesNotFitError", "estimate_train_memory", "check_fits"]

GiB = 1 << 30


@dataclass(frozen=True)
class ModelShape:
    """What memory depends on, for a decoder-only transformer (dense or MoE)."""

    name: str
    num_layers: int
    hidden: int
    intermediate: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool
    num_experts: int = 0
    """MoE: routed experts per layer (0: dense MLP of width `intermediate`)."""
    experts_per_token: int = 0
    moe_intermediate: int = 0

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], name: str = "model") -> "ModelShape":
        """From a `config.json` dict (Qwen2, Qwen3, Qwen3-MoE, Llama-style keys)."""
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return cls(
                name=name, num_layers=int(cfg["num_hidden_layers"]), hidden=hidden,
                intermediate=int(cfg.get("intermediate_size", 0)), vocab=int(cfg["vocab_size"]), heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or hidden // heads), tied=bool(cfg.get("tie_word_embeddings", False)),
                num_experts=int(cfg.get("num_experts", 0) or 0), experts_per_token=int(cfg.get("num_experts_per_tok", 0) or 0),
                moe_intermediate=int(cfg.get("moe_intermediate_size", 0) or 0))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"config of {name!r} lacks a field memory estimates need: {e}") from e

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attn = h * q + 2 * h * kv + q * h + q + 2 * kv  # q/k/v/o (+ q/k/v biases)
        if self.num_experts:
            mlp = self.num_experts * 3 * h * self.moe_intermediate + h * self.num_experts
        else:
            mlp = 3 * h * self.intermediate
        return attn + mlp + 2 * h

    @property
    def root_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    @property
    def params(self) -> int:
        return self.root_params + self.num_layers * self.layer_params

    def activation_bytes_per_token_layer(self, c: int) -> int:
        """A: bytes autograd keeps per token in one decoder layer (module docstring)."""
        width = self.intermediate if not self.num_experts else self.experts_per_token * self.moe_intermediate
        return (8 + 5 * c) * self.hidden + 2 * c * self.kv_heads * self.head_dim + 4 * c * width


@dataclass
class MemoryEstimate:
    """Peak bytes of one rank, with the parts of each phase (names are for tables)."""

    peak_bytes: int
    phase: str
    """Which phase peaks: forward_backward, end_of_backward or optimizer_step."""
    parts: dict[str, int] = field(default_factory=dict)
    """Bytes of each part of the peaking phase."""
    phases: dict[str, int] = field(default_factory=dict)

    @property
    def peak_gib(self) -> float:
        return self.peak_bytes / GiB


def estimate_train_memory(shape: ModelShape, *, world_size: int, micro_batch_tokens: int, response_tokens: int,
                          param_dtype: str = "bfloat16", gradient_checkpointing: bool = True,
                          logprob_chunk_tokens: int = 1024, resident_state: bool = True) -> MemoryEstimate:
    """Peak device bytes of one rank during one step (module docstring). `micro_batch_tokens`:
    padded tokens of the largest micro-batch; `response_tokens`: its response tokens (rows the loss
    covers). `resident_state=False` leaves out master weights and AdamW moments (what a step
    allocates on top of what is already there: the CPU benchmark measures that)."""
    if world_size < 1 or micro_batch_tokens < 1:
        raise ValueError("world_size and micro_batch_tokens must be >= 1")
    c = 2 if param_dtype == "bfloat16" else 4
    P, W, T, R = shape.params, world_size, micro_batch_tokens, min(response_tokens, micro_batch_tokens)
    H, V, L = shape.hidden, shape.vocab, shape.num_layers
    state = {"master_fp32": 4 * P // W, "grads_fp32": 4 * P // W, "adam_fp32": 8 * P // W}
    if not resident_state:
        state = {"grads_fp32": state["grads_fp32"]}
    root = c * shape.root_params
    a = shape.activation_bytes_per_token_layer(c)
    if gradient_checkpointing:
        acts = {"checkpointed_layer_inputs": L * T * c * H, "one_layer_recompute_and_grads": 2 * T * a}
    else:
        acts = {"saved_activations": L * T * a}
    acts["final_norm_and_hidden"] = T * (4 + 2 * c) * H
    if logprob_chunk_tokens > 0:
        acts["logits_chunk"] = min(logprob_chunk_tokens, R) * V * (c + 16)
    else:
        acts["full_logits"] = c * T * V + R * V * (c + 16)
    fwd = {**state, "root_params": root, "layer_params_in_flight": 2 * c * shape.layer_params, **acts,
           "layer_grads_in_flight": (c + 4) * shape.layer_params}
    end = {**state, "root_params": root, "root_grads_in_flight": (c + 4) * shape.root_params}
    opt = {**state, "adamw_temporaries": 8 * P // W}
    phases = {"forward_backward": fwd, "end_of_backward": end, "optimizer_step": opt}
    totals = {k: sum(v.values()) for k, v in phases.items()}
    worst = max(totals, key=totals.__getitem__)
    return MemoryEstimate(totals[worst], worst, dict(phases[worst]), totals)


class ModelDoesNotFitError(ValueError):
    """A model's training step cannot fit its home devices (by `estimate_train_memory`)."""


def check_fits(shape: ModelShape, *, devices: Sequence[int], device_memory_bytes: int, micro_batch_tokens: int,
               response_tokens: int | None = None, param_dtype: str = "bfloat16", gradient_checkpointing: bool = True,
               logprob_chunk_tokens: int = 1024, reserve_fraction: float = 0.1,
               asleep_bytes: int = 0) -> MemoryEstimate:
    """Raise `ModelDoesNotFitError` naming the model, the devices and the memory if one training
    rank on `devices` (the home set: FSDP world size = len(devices)) needs more than
    `(1 - reserve_fraction) * device_memory_bytes - asleep_bytes`; else return the estimate. The
    inference engines on those devices are asleep while training runs: their weights and KV cache
    are released, and `asleep_bytes` is what they still hold there (context, CUDA graphs)."""
    if not devices:
        raise ModelDoesNotFitError(f"model {shape.name!r} has no home devices to train on")
    if not 0 <= reserve_fraction < 1:
        raise ValueError(f"reserve_fraction must be in [0, 1), got {reserve_fraction}")
    est = estimate_train_memory(shape, world_size=len(devices), micro_batch_tokens=micro_batch_tokens,
                                response_tokens=micro_batch_tokens if response_tokens is None else response_tokens,
                                param_dtype=param_dtype, gradient_checkpointing=gradient_checkpointing,
                                logprob_chunk_tokens=logprob_chunk_tokens)
    usable = int((1 - reserve_fraction) * device_memory_bytes) - int(asleep_bytes)
    if est.peak_bytes > usable:
        top = sorted(est.parts.items(), key=lambda kv: -kv[1])[:3]
        raise ModelDoesNotFitError(
            f"model {shape.name!r} ({shape.params / 1e9:.2f}B parameters) does not fit its home devices "
            f"{list(devices)}: one training rank needs {est.peak_bytes / GiB:.1f} GiB at its peak ({est.phase}; "
            f"largest parts: {', '.join(f'{k} {v / GiB:.1f} GiB' for k, v in top)}) but each device has "
            f"{device_memory_bytes / GiB:.1f} GiB ({usable / GiB:.1f} GiB usable after a {reserve_fraction:.0%} reserve"
            f"{f' and {asleep_bytes / GiB:.1f} GiB its asleep engines keep' if asleep_bytes else ''}) "
            f"at micro_batch_tokens={micro_batch_tokens}, param_dtype={param_dtype}, "
            f"gradient_checkpointing={gradient_checkpointing}. Use more home devices, fewer tokens per micro-batch "
            "(algo.micro_batch_tokens) or gradient checkpointing.")
    return est
