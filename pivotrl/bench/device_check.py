"""The device check's Python half (`scripts/device_check.sh` runs it, then two 3-step train runs).

`python -m pivotrl.bench.device_check --mode gpu|cpu --out DIR` writes `DIR/device_check.json`:
one entry per check, each `{"ok": bool, "seconds": s, ...figures}` or `{"ok": false, "error": ...}`
(a failed check does not stop the others; the exit code is 1 if any failed). Checks, in order:

1. `checkpoints`: random-weight checkpoints of real shapes made on the spot (`gpu`: a
   Qwen2.5-1.5B-shaped policy and a small Qwen3-MoE GenRM, bf16; `cpu`: tiny ones, float32).
2. `trainer`: the memory-sane trainer (bf16 on GPU, gradient checkpointing, chunked log-probs,
   token micro-batches): step times, offload and reload times, peak memory (GPU:
   `max_memory_allocated`; CPU: peak RSS), memory held after offload (GPU: allocated and
   reserved, i.e. whether the allocator's cache was emptied), and the `check_fits` estimate.
3. `weight_sync`: `publish_shards` into a GPS on the Ray transport and `load_from_gps` into the
   policy engine (s/GB of each, and memcpy for scale).
4. `engine`: the policy engine (vLLM on GPU, the CPU engine on cpu) decodes at several batch sizes;
   its iteration samples, the throughput model fitted to them and the fit's mean relative error.
5. `handoff`: the role hosts' shift down / up of the policy (sleep level 2, new weights) and of
   the GenRM (level 1, weights kept), each timed, on the same device.

Sizes keep the GPU run inside 8 minutes on one H200 with the two train runs; `cpu` runs the same
code at tiny sizes (CI: `tests/bench/test_device_check.py`).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

GPU_POLICY = dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                  num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=True, rope_theta=1e6)  # Qwen2.5-1.5B's shape
GPU_GENRM = dict(vocab_size=151936, hidden_size=1024, intermediate_size=2048, moe_intermediate_size=512,
                 num_experts=32, num_experts_per_tok=4, num_hidden_layers=8, num_attention_heads=16,
                 num_key_value_heads=4, head_dim=64, max_position_embeddings=4096, tie_word_embeddings=False)
CPU_POLICY = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256,
                  tie_word_embeddings=False)
CPU_GENRM = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=4,
                 num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                 head_dim=32, max_position_embeddings=256, tie_word_embeddings=False)


def make_checkpoint(path: Path, kind: str, shape: dict, dtype: str, device: str) -> Path:
    """A random-weight Hugging Face folder (with the project's tokenizer) of `shape`."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    from pivotrl.models.tiny import save_model_folder

    cfg_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if kind == "qwen2" else (Qwen3MoeConfig, Qwen3MoeForCausalLM)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(cfg_cls(**shape, torch_dtype=dtype)).to(getattr(torch, dtype))
    return save_model_folder(model.cpu(), path, dtype)


def _engine_cfg(gpu: bool, **kw: Any):
    from pivotrl.config.engine import EngineConfig

    if gpu:
        return EngineConfig(name="vllm", dtype="bfloat16", max_num_seqs=256, vllm_gpu_memory_utilization=0.25,
                            max_model_len=2048, **kw)
    return EngineConfig(name="cpu", num_threads=1, max_num_seqs=32, kv_capacity_tokens=8192, **kw)


def _peak_memory() -> dict[str, float]:
    import torch

    if torch.cuda.is_available():
        return {"peak_gpu_gib": torch.cuda.max_memory_allocated() / 2**30,
                "allocated_gib": torch.cuda.memory_allocated() / 2**30,
                "reserved_gib": torch.cuda.memory_reserved() / 2**30}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return {"peak_rss_gib": int(line.split()[1]) / 2**20}
    return {}


def check_trainer(ctx: dict) -> dict:
    import torch

    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.trainer.memory import ModelShape, check_fits
    from pivotrl.trainer.train_batch import TrainBatch
    from pivotrl.trainer.trainer import Trainer

    gpu = ctx["gpu"]
    n, plen, rlen = (16, 256, 768) if gpu else (8, 8, 24)
    vocab = json.loads((ctx["policy"] / "config.json").read_text())["vocab_size"]
    rng = random.Random(0)

    def batch(v: int) -> TrainBatch:
        return TrainBatch(prompt_ids=[[rng.randrange(4, vocab) for _ in range(plen)] for _ in range(n)],
                          response_ids=[[rng.randrange(4, vocab) for _ in range(rlen)] for _ in range(n)],
                          versions=[v] * n, rewards=[rng.random() for _ in range(n)], group_ids=[i // 4 for i in range(n)])

    cfg = TrainerSpec(device="cuda" if gpu else "cpu", param_dtype="bfloat16" if gpu else "float32",
                        gradient_checkpointing=True, logprob_chunk_tokens=1024 if gpu else 16,
                        micro_batch_tokens=4 * (plen + rlen), publish_dtype="bfloat16" if gpu else "float32",
                        lr=1e-5, staleness=4)
    out: dict[str, Any] = {}
    shape = ModelShape.from_hf_config(json.loads((ctx["policy"] / "config.json").read_text()), "policy")
    if gpu:
        est = check_fits(shape, devices=[0], device_memory_bytes=torch.cuda.get_device_properties(0).total_memory,
                         micro_batch_tokens=4 * (plen + rlen), response_tokens=4 * rlen)
        out["estimated_peak_gib"] = est.peak_gib
        torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    tr = Trainer(cfg, ctx["policy"])
    out["start_s"] = time.perf_counter() - t
    steps = []
    for s in range(2):
        t = time.perf_counter()
        m = tr.step(batch(tr.version))
        steps.append(time.perf_counter() - t)
    out.update(step_s=steps, micro_batches=m["micro_batches"], tokens_per_step=m["tokens_trained"], **_peak_memory())
    off = tr.offload()
    out.update(offload_s=off["offload_s"], offloaded_gib=off["offloaded_bytes"] / 2**30,
               cache_emptied=bool(off["cache_emptied"]), after_offload=_peak_memory())
    rel = tr.reload()
    out["reload_s"] = rel["reload_s"]
    off2 = tr.offload()
    out["second_offload_host_allocations"] = off2["host_allocations"]  # 0: pinned buffers reused
    tr.reload()
    ctx["trainer"] = tr
    return out


def check_weight_sync(ctx: dict) -> dict:
    import ray
    import torch

    from pivotrl.config.gps import GPSConfig
    from pivotrl.engines.weight_sync import load_from_gps, publish_shards
    from pivotrl.gps.layout import ModelSpec
    from pivotrl.gps.ray_transport import make_ray_store
    from pivotrl.config.engine import EngineSpec
    from pivotrl.runtime.roles import InferenceHost, RoleSpec
    from pivotrl.core.types import Role

    ray.init(address="local", num_cpus=1, resources={"gps_node_0": 1}, include_dashboard=False,
             logging_level="ERROR")
    store = make_ray_store(GPSConfig(transport="ray", ray_node_resource="gps_node_{}"), 1)
    ctx["store"] = store
    dtype = "bfloat16" if ctx["gpu"] else "float32"
    store.register("policy", spec=ModelSpec.from_config(json.loads((ctx["policy"] / "config.json").read_text()),
                                                        dtype=dtype))
    tr = ctx["trainer"]
    t = time.perf_counter()
    v = publish_shards(tr.worker, store, "policy")
    pub = time.perf_counter() - t
    nbytes = store.spec("policy").nbytes
    src = torch.empty(nbytes, dtype=torch.uint8).random_()
    dst = torch.empty_like(src)
    dst.copy_(src)
    t = time.perf_counter()
    dst.copy_(src)
    memcpy = time.perf_counter() - t
    host = InferenceHost(RoleSpec(Role.ROLLOUT, "policy", str(ctx["policy"]),
                                  engine=EngineSpec.for_role(_engine_cfg(ctx["gpu"]), "rollout")))
    t = time.perf_counter()
    host.shift_up(None, 0)
    cold = time.perf_counter() - t
    ctx["policy_host"] = host
    ev = load_from_gps(host.engine, store, "policy", node=0, engine_version=tr.version)
    return {"gps_version": v, "model_gb": nbytes / 1e9, "publish_s": pub, "publish_s_per_gb": pub / (nbytes / 1e9),
            "load_s": ev["seconds"], "load_s_per_gb": ev["seconds"] / (nbytes / 1e9), "load_path": ev["path"],
            "memcpy_s_per_gb": memcpy / (nbytes / 1e9), "engine_cold_start_s": cold}


def check_engine(ctx: dict) -> dict:
    from pivotrl.core.throughput import ThroughputModel
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams

    eng = ctx["policy_host"].engine
    gpu = ctx["gpu"]
    levels, max_tokens = ((1, 16, 64, 256), 128) if gpu else ((1, 4, 12), 16)
    rng = random.Random(1)
    eng.stats(drain=True)
    base = 0
    for n in levels:
        reqs = [GenerationRequest(base + i, [rng.randrange(4, 100) for _ in range(32 if gpu else 6)],
                                  SamplingParams(temperature=1.0, max_tokens=max_tokens, ignore_eos=True))
                for i in range(n)]
        base += n
        eng.generate(reqs)
    st = eng.stats(drain=True)
    samples = [(s.num_seqs, s.kv_tokens, s.seconds) for s in st.iterations]
    model = ThroughputModel.fit(samples)
    errs = [abs(model.iter_time(n, k) - t) / t for n, k, t in samples]
    return {"samples": [list(s) for s in samples[:2000]], "n_samples": len(samples),
            "fit": {"A": model.A, "B": model.B, "C": model.C, "D": model.D},
            "fit_mean_rel_error": sum(errs) / len(errs), "generated_tokens": st.generated_tokens}


def check_handoff(ctx: dict) -> dict:
    from pivotrl.core.types import Role
    from pivotrl.engines.weight_sync import load_from_gps
    from pivotrl.config.engine import EngineSpec
    from pivotrl.runtime.roles import InferenceHost, RoleSpec

    out: dict[str, Any] = {}
    pol: InferenceHost = ctx["policy_host"]
    d = pol.shift_down()
    out["policy_shift_down_s"], out["policy_sleep_level"] = d.seconds, d.detail.get("sleep_level")
    gen = InferenceHost(RoleSpec(Role.REWARD, "genrm", str(ctx["genrm"]),
                                 engine=EngineSpec.for_role(_engine_cfg(ctx["gpu"]), "reward")))
    u = gen.shift_up(None, 0)
    out["genrm_cold_shift_up_s"] = u.seconds
    d = gen.shift_down()
    out["genrm_shift_down_s"], out["genrm_sleep_level"] = d.seconds, d.detail.get("sleep_level")
    u = gen.shift_up(None, 0)
    out["genrm_warm_shift_up_s"], out["genrm_shift_up_detail"] = u.seconds, u.detail
    out["genrm_needed_gps"] = False if u.detail.get("weights_kept") else True
    gen.shift_down()
    man = ctx["store"].file_manifest("policy", 0)
    try:
        u = pol.shift_up(man if man is not None else None, 1)
    finally:
        if man is not None:
            man.release()
    out["policy_warm_shift_up_s"], out["policy_shift_up_detail"] = u.seconds, u.detail
    ev = load_from_gps(pol.engine, ctx["store"], "policy", node=0, engine_version=2)
    out["policy_reload_while_serving_s"] = ev["seconds"]
    gen.close()
    return out


CHECKS: list[tuple[str, Callable[[dict], dict]]] = [
    ("trainer", check_trainer), ("weight_sync", check_weight_sync), ("engine", check_engine), ("handoff", check_handoff),
]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("gpu", "cpu"), required=True)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    import torch

    gpu = a.mode == "gpu"
    if gpu and not torch.cuda.is_available():
        print("device_check --mode gpu: CUDA is not available (use --cpu)", file=sys.stderr)
        return 2
    torch.set_num_threads(1 if not gpu else min(8, os.cpu_count() or 1))
    a.out.mkdir(parents=True, exist_ok=True)
    ckpt = Path(tempfile.mkdtemp(prefix="pivotrl-devcheck-", dir=a.out))
    ctx: dict[str, Any] = {"gpu": gpu}
    results: dict[str, Any] = {"mode": a.mode}
    t = time.perf_counter()
    try:
        dt, dev = ("bfloat16", "cuda") if gpu else ("float32", "cpu")
        ctx["policy"] = make_checkpoint(ckpt / "policy", "qwen2", GPU_POLICY if gpu else CPU_POLICY, dt, dev)
        ctx["genrm"] = make_checkpoint(ckpt / "genrm", "qwen3_moe", GPU_GENRM if gpu else CPU_GENRM, dt, dev)
        results["checkpoints"] = {"ok": True, "seconds": time.perf_counter() - t,
                                  "policy": str(ctx["policy"]), "genrm": str(ctx["genrm"])}
    except Exception:  # noqa: BLE001 - recorded; nothing else can run without checkpoints
        results["checkpoints"] = {"ok": False, "error": traceback.format_exc()}
    if results["checkpoints"]["ok"]:
        for name, fn in CHECKS:
            t = time.perf_counter()
            try:
                results[name] = {"ok": True, **fn(ctx), "seconds": time.perf_counter() - t}
            except Exception:  # noqa: BLE001 - recorded, the next check still runs
                results[name] = {"ok": False, "error": traceback.format_exc(), "seconds": time.perf_counter() - t}
            print(f"device_check {name}: {'ok' if results[name]['ok'] else 'FAILED'} "
                  f"({results[name]['seconds']:.1f} s)", flush=True)
    for key in ("policy_host",):
        if key in ctx:
            ctx[key].close()
    if "trainer" in ctx:
        ctx["trainer"].close()
    if "store" in ctx:
        import ray

        ctx["store"].close()
        ray.shutdown()
    (a.out / "device_check.json").write_text(json.dumps(results, indent=2, default=str))
    failed = [k for k, v in results.items() if isinstance(v, dict) and not v.get("ok")]
    print(f"device_check: wrote {a.out / 'device_check.json'}; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
