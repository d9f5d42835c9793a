"""GRPO trainer on CPU: step time (world size 1 and 2, FSDP2 over gloo) and peak memory per token.

`python -m pivotrl.bench trainer [--json PATH] [--layers 4] [--steps 3] [--only time|memory]`.

- time: start-up, per-step time and the time to publish the full state dict (what goes to the
  GPS after each step), on the tiny policy.
- memory: the peak resident memory a training step adds, per training token, for the original
  path (full fp32 logits, fixed micro-batch) and the memory-sane one (chunked log-probs, token
  micro-batches, gradient checkpointing), on a small Qwen2 with a 8192-token vocabulary (so the
  logits matter, as they do at 152K). Each configuration runs in its own process: one warm-up step
  (AdamW state exists afterwards), then the kernel's peak-RSS mark is reset (`/proc/self/clear_refs`)
  and the second step's peak minus the RSS before it is the step's memory. glibc is told to map
  every allocation over 64 KiB (`MALLOC_MMAP_THRESHOLD_`), so freed tensors really leave the RSS.
  Each row also gives `pivotrl.trainer.memory.estimate_train_memory`'s prediction for the same
  step (without the already-resident master weights and AdamW moments), to check that arithmetic.
"""
from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pivotrl.bench.common import parser, print_table, write_json


def random_batch(n: int, seed: int, version: int):
    """`n` random sequences (16-32 prompt, 8-32 response tokens, ids < 100) at `version`."""
    from pivotrl.trainer.train_batch import TrainBatch

    rng = random.Random(seed)
    return TrainBatch(
        prompt_ids=[[rng.randrange(4, 100) for _ in range(rng.randint(16, 32))] for _ in range(n)],
        response_ids=[[rng.randrange(4, 100) for _ in range(rng.randint(8, 32))] for _ in range(n)],
        versions=[version] * n, rewards=[rng.random() for _ in range(n)], group_ids=[i // 8 for i in range(n)])


MEMORY_MODEL = dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512,
                    vocab_size=8192, max_position_embeddings=2048, tie_word_embeddings=False)
#: (name, TrainerSpec overrides): the original path and the memory-sane one
MEMORY_CONFIGS = (
    ("original", dict(init_on_meta=False, logprob_chunk_tokens=0, gradient_checkpointing=False,
                      micro_batch_tokens=0, micro_batch_size=8)),
    ("chunked", dict(logprob_chunk_tokens=256, gradient_checkpointing=False, micro_batch_tokens=0,
                     micro_batch_size=8)),
    ("chunked+ckpt", dict(logprob_chunk_tokens=256, gradient_checkpointing=True, micro_batch_tokens=0,
                          micro_batch_size=8)),
    ("chunked+ckpt+tokens", dict(logprob_chunk_tokens=256, gradient_checkpointing=True, micro_batch_tokens=1024)),
)


def _memory_batch(version: int, n: int = 8, prompt: int = 64, response: int = 448):
    from pivotrl.trainer.train_batch import TrainBatch

    rng = random.Random(version)
    return TrainBatch(prompt_ids=[[rng.randrange(4, 8000) for _ in range(prompt)] for _ in range(n)],
                      response_ids=[[rng.randrange(4, 8000) for _ in range(response)] for _ in range(n)],
                      versions=[version] * n, rewards=[rng.random() for _ in range(n)],
                      group_ids=[i // 4 for i in range(n)])


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _memory_child(model: str, overrides: dict) -> dict:
    """One configuration in this (fresh) process: see the module docstring."""
    import torch

    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.trainer.memory import ModelShape, estimate_train_memory
    from pivotrl.trainer.trainer import Trainer

    torch.set_num_threads(1)
    cfg = TrainerSpec(lr=1e-4, device="cpu", num_threads=1, **overrides)
    with Trainer(cfg, model) as tr:
        tr.step(_memory_batch(0))
        b = _memory_batch(1)
        Path("/proc/self/clear_refs").write_text("5")
        before = _status_kib("VmRSS")
        t0 = time.perf_counter()
        m = tr.step(b)
        secs = time.perf_counter() - t0
        peak = _status_kib("VmHWM")
    shape = ModelShape.from_hf_config(json.loads((Path(model) / "config.json").read_text()), "bench")
    lens = sorted(len(p) + len(r) for p, r in zip(b.prompt_ids, b.response_ids))
    if cfg.micro_batch_tokens:
        per, tok = max(1, cfg.micro_batch_tokens // lens[-1]), cfg.micro_batch_tokens
        tok = per * lens[-1]
    else:
        per = min(cfg.micro_batch_size, len(lens))
        tok = per * lens[-1]
    resp = per * len(b.response_ids[0])
    est = estimate_train_memory(shape, world_size=1, micro_batch_tokens=tok, response_tokens=resp,
                                param_dtype=cfg.param_dtype, gradient_checkpointing=cfg.gradient_checkpointing,
                                logprob_chunk_tokens=cfg.logprob_chunk_tokens, resident_state=False)
    n_tok = int(m["tokens_trained"])
    added = (peak - before) * 1024
    return {"step_peak_mib": added / 2**20, "bytes_per_train_token": added / n_tok,
            "predicted_mib": est.peak_bytes / 2**20, "predicted_phase": est.phase,
            "tokens_trained": n_tok, "micro_batches": int(m["micro_batches"]), "step_s": secs}


def memory_rows(layers: int | None = None) -> list[dict]:
    """Run every `MEMORY_CONFIGS` entry in its own process; one row each."""
    from pivotrl.config.rl import TinyModelConfig
    from pivotrl.models.tiny import create_tiny_model

    spec = dict(MEMORY_MODEL, **({"num_layers": layers} if layers else {}))
    model = create_tiny_model(Path(tempfile.mkdtemp()) / "policy", TinyModelConfig(**spec), seed=0)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    rows = []
    for name, over in MEMORY_CONFIGS:
        code = ("import json,sys; from pivotrl.bench.trainer import _memory_child; "
                "print('ROW', json.dumps(_memory_child(sys.argv[1], json.loads(sys.argv[2]))))")
        out = subprocess.run([sys.executable, "-c", code, str(model), json.dumps(over)], env=env,
                             capture_output=True, text=True, timeout=900)
        line = [ln for ln in out.stdout.splitlines() if ln.startswith("ROW ")]
        if out.returncode != 0 or not line:
            raise RuntimeError(f"memory bench {name} failed:\n{out.stderr[-3000:]}")
        rows.append({"path": name, **json.loads(line[-1][4:])})
    base = rows[0]["bytes_per_train_token"]
    for r in rows:
        r["vs_original"] = r["bytes_per_train_token"] / base
    return rows


def main(argv: list[str]) -> int:
    p = parser("GRPO trainer step time (tiny policy, FSDP2/gloo)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--only", choices=("time", "memory"), default=None)
    a = p.parse_args(argv)
    mem = [] if a.only == "time" else memory_rows()
    if mem:
        print_table(mem, "trainer step: peak memory added per training token (CPU, one process per row)")
    if a.only == "memory":
        write_json(a.json, "trainer", [], memory=mem)
        return 0
    import torch

    from pivotrl.config.rl import TinyModelConfig
    from pivotrl.config.trainer import TrainerSpec
    from pivotrl.trainer.trainer import Trainer
    from pivotrl.models.tiny import create_tiny_model

    torch.set_num_threads(1)
    model = create_tiny_model(Path(tempfile.mkdtemp()) / "policy", TinyModelConfig(num_layers=a.layers), seed=0)
    rows = []
    for ws in (int(x) for x in a.world_sizes.split(",")):
        for n, mbs in ((64, 16), (256, 64)):
            t0 = time.perf_counter()
            cfg = TrainerSpec(world_size=ws, micro_batch_size=mbs, lr=1e-4, num_threads=1, device="cpu")
            with Trainer(cfg, model) as tr:
                start = time.perf_counter() - t0
                times = []
                for s in range(a.steps):
                    t = time.perf_counter()
                    tr.step(random_batch(n, s, tr.version))
                    times.append(time.perf_counter() - t)
                t = time.perf_counter()
                tr.state_dict()
                publish = time.perf_counter() - t
            rows.append({"world_size": ws, "sequences": n, "micro_batch": mbs, "start_s": start,
                         "step_s_median": statistics.median(times), "step_s_min": min(times),
                         "publish_s": publish})
    print_table(rows, "trainer step time")
    write_json(a.json, "trainer", rows, memory=mem)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
