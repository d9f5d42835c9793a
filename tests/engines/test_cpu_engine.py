"""CPU engine: greedy equals `transformers` generate, abort/resume equivalence, weight loading,
sampling, admission limits, stats and memory release. All on tiny random-init Qwen2 folders."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pivotrl.config.engine import EngineConfig
from pivotrl.engines.cpu_engine import CPUEngine
from pivotrl.engines.protocol import FINISH_LENGTH, FINISH_STOP, GenerationRequest, SamplingParams

from .conftest import hf_greedy

# EOS stops a sequence, as in transformers generate (the reference).
GREEDY = SamplingParams(temperature=0, max_tokens=24)


def _reqs(prompts, sp=GREEDY, ids=None):
    return [GenerationRequest(i if ids is None else ids[i], p, sp) for i, p in enumerate(prompts)]


@pytest.fixture
def engine(tiny_dir):
    return CPUEngine(tiny_dir, EngineConfig(name="cpu", num_threads=1))


@pytest.fixture(scope="module")
def uninterrupted(tiny_dir, prompts):
    """Greedy completions of all prompts, run together without interruption."""
    return CPUEngine(tiny_dir, EngineConfig(name="cpu")).generate(_reqs(prompts))


def test_greedy_matches_transformers_generate(uninterrupted, tiny_dir, prompts):
    # Batched, left-padded, continuous batching vs one unpadded prompt at a time in transformers.
    for c, p in zip(uninterrupted, prompts):
        assert c.finish_reason in (FINISH_LENGTH, FINISH_STOP) and 0 < len(c.token_ids) <= 24
        assert c.token_ids == hf_greedy(tiny_dir, p, 24), c.seq_id
    assert len({tuple(c.token_ids) for c in uninterrupted}) > 1  # the prompts really matter
    assert sum(len(c.token_ids) for c in uninterrupted) > 3 * 24  # and most run long


def test_sequences_join_mid_flight_match(engine, uninterrupted, prompts):
    """Sequences admitted at different iterations (different padding) give the same tokens."""
    done = {}
    for i, r in enumerate(_reqs(prompts)):
        engine.submit(r)
        for _ in range(i + 2):
            done.update({c.seq_id: c for c in engine.step()})
    while engine.has_unfinished():
        done.update({c.seq_id: c for c in engine.step()})
    assert [done[i].token_ids for i in range(len(prompts))] == [c.token_ids for c in uninterrupted]


def test_abort_resume_equals_uninterrupted(engine, uninterrupted, prompts):
    reqs = _reqs(prompts)
    for r in reqs[:4]:
        engine.submit(r)
    done = {}
    for _ in range(5):
        done.update({c.seq_id: c for c in engine.step()})
    aborted = engine.abort([0, 2, 3])
    assert sorted(aborted) == [0, 2, 3]
    assert all(len(v) == 5 for v in aborted.values())  # 1 from prefill + 4 decode iterations
    assert aborted[0] == uninterrupted[0].token_ids[:5]
    for r in reqs[4:]:
        engine.submit(r)
    for _ in range(3):
        done.update({c.seq_id: c for c in engine.step()})
    aborted2 = engine.abort([1, 4])  # abort again, one of them mid-flight for the first time
    for sid, toks in {**aborted, **aborted2}.items():
        engine.submit(GenerationRequest(sid, prompts[sid], GREEDY, generated=toks))
    while engine.has_unfinished():
        done.update({c.seq_id: c for c in engine.step()})
    assert sorted(done) == list(range(len(prompts)))
    for i, ref in enumerate(uninterrupted):
        assert done[i].token_ids == ref.token_ids, i
    assert done[2].reprefill_tokens == len(prompts[2]) + 5
    assert done[5].reprefill_tokens == 0
    st = engine.stats()
    assert st.reprefill_tokens == sum(len(prompts[s]) + len(t) for s, t in {**aborted, **aborted2}.items())


def test_abort_all_and_unknown_ids(engine, prompts):
    for r in _reqs(prompts):
        engine.submit(r)
    engine.step()
    engine.step()
    assert engine.abort([999]) == {}
    snap = engine.snapshot()
    out = engine.abort()
    assert out == snap and len(out) == len(prompts)
    assert not engine.has_unfinished() and engine.stats().running == 0 and engine.stats().kv_tokens == 0


def test_resume_with_nothing_left_finishes_at_once(engine, prompts):
    sp = SamplingParams(temperature=0, max_tokens=3, stop_token_ids=(9,))
    engine.submit(GenerationRequest(1, prompts[0], sp, generated=[4, 5, 6]))
    engine.submit(GenerationRequest(2, prompts[0], sp, generated=[4, 9]))
    got = {c.seq_id: c for c in engine.step()}
    assert got[1].finish_reason == FINISH_LENGTH and got[1].token_ids == [4, 5, 6]
    assert got[2].finish_reason == FINISH_STOP and got[2].token_ids == [4, 9]


def test_stop_tokens_end_sequence(engine, uninterrupted, prompts):
    ref = uninterrupted[0].token_ids
    stop = ref[6]
    cut = ref.index(stop)
    c = engine.generate([GenerationRequest(0, prompts[0], SamplingParams(temperature=0, max_tokens=24,
                                                                       stop_token_ids=(stop,)))])[0]
    assert c.finish_reason == FINISH_STOP and c.token_ids == ref[:cut + 1]


def test_load_weights_changes_outputs_to_match_reference(engine, uninterrupted, tiny_dir_b, prompts):
    from transformers import AutoModelForCausalLM

    sd_b = AutoModelForCausalLM.from_pretrained(str(tiny_dir_b)).state_dict()
    engine.load_weights(sd_b, version=7)
    out = engine.generate(_reqs(prompts))
    assert all(c.version == 7 for c in out) and engine.stats().version == 7
    assert [c.token_ids for c in out] != [c.token_ids for c in uninterrupted]
    for c, p in zip(out, prompts):
        assert c.token_ids == hf_greedy(tiny_dir_b, p, 24), c.seq_id


def test_load_weights_bad_input(engine):
    sd = {k: v.clone() for k, v in engine.model.state_dict().items()}
    with pytest.raises(ValueError, match="unknown parameter names"):
        engine.load_weights({"not.a.param": torch.zeros(1)}, 1)
    name = next(iter(sd))
    with pytest.raises(ValueError, match=f"{name} has shape"):
        engine.load_weights({name: torch.zeros(3, 3)}, 1)
    assert engine.version == 0


def test_seeded_sampling_reproducible_and_top_p_tiny_is_greedy(engine, uninterrupted, prompts):
    sp = lambda seed: SamplingParams(temperature=1.0, top_p=0.95, max_tokens=24, seed=seed, ignore_eos=True)  # noqa: E731
    a = engine.generate([GenerationRequest(0, prompts[0], sp(11)), GenerationRequest(1, prompts[1], sp(12))])
    # Same seed in a different batch (alone, other row order) gives the same tokens.
    b = engine.generate([GenerationRequest(5, prompts[1], sp(12)), GenerationRequest(6, prompts[0], sp(11))])
    assert a[0].token_ids == b[1].token_ids and a[1].token_ids == b[0].token_ids
    c = engine.generate([GenerationRequest(0, prompts[0], sp(13))])
    assert c[0].token_ids != a[0].token_ids
    # top_p this small keeps only the most likely token: sampling degenerates to greedy.
    g = engine.generate(_reqs(prompts, SamplingParams(temperature=1.0, top_p=1e-6, max_tokens=24)))
    assert [x.token_ids for x in g] == [x.token_ids for x in uninterrupted]


def test_unseeded_sampling_follows_distribution(engine, prompts):
    """Temperature sampling draws different tokens across sequences (not argmax every time)."""
    sp = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)
    out = engine.generate([GenerationRequest(i, prompts[0], sp) for i in range(16)])
    assert len({tuple(c.token_ids) for c in out}) > 8


def test_identical_rows_are_prefilled_once_and_each_gets_the_greedy_tokens(engine, uninterrupted, prompts):
    """Three copies of every prompt in one batch: the prefill runs each prompt once (the model sees
    one row per distinct prompt) and every copy gets the uninterrupted greedy tokens. (Sampled
    copies of one prompt still draw their own tokens: `test_unseeded_sampling_follows_distribution`.)"""
    rows: list[int] = []
    hook = engine.model.register_forward_pre_hook(
        lambda _m, _a, kw: rows.append(kw["input_ids"].shape[0]) if kw["input_ids"].shape[1] > 1 else None,
        with_kwargs=True)
    n = len(prompts)
    out = engine.generate(_reqs([prompts[i % n] for i in range(3 * n)]))
    hook.remove()
    assert rows == [n]  # one prefill call of the distinct prompts only
    assert [c.token_ids for c in out] == [uninterrupted[i % n].token_ids for i in range(3 * n)]


def test_admission_limits(tiny_dir, prompts, uninterrupted):
    cfg = EngineConfig(name="cpu", max_num_seqs=2, kv_capacity_tokens=80)
    eng = CPUEngine(tiny_dir, cfg)
    for r in _reqs(prompts):
        eng.submit(r)
    done, max_running = {}, 0
    while eng.has_unfinished():
        done.update({c.seq_id: c for c in eng.step()})
        st = eng.stats()
        max_running = max(max_running, st.running)
        assert st.running <= 2
    assert max_running == 2
    assert [done[i].token_ids for i in range(len(prompts))] == [c.token_ids for c in uninterrupted]


def test_stats_sanity(engine, prompts):
    for r in _reqs(prompts[:4]):
        engine.submit(r)
    engine.step()  # prefill
    st = engine.stats()
    plen = sum(len(p) for p in prompts[:4])
    assert st.running == 4 and st.waiting == 0 and st.iterations == []
    assert [(s.tokens, s.num_seqs) for s in st.prefills] == [(plen, 4)]
    assert st.kv_tokens == plen + 4 and st.free_kv_tokens == st.kv_capacity_tokens - st.kv_tokens
    for _ in range(3):
        engine.step()
    st = engine.stats()
    assert [(s.num_seqs, s.kv_tokens) for s in st.iterations] == [(4, plen + 4), (4, plen + 8), (4, plen + 12)]
    assert all(s.seconds > 0 for s in st.iterations)
    assert st.generated_tokens == 16 and st.kv_tokens == plen + 16
    assert engine.stats().iterations == []  # drained
    assert len(engine.stats(drain=False).iterations) == 0


def test_iteration_samples_cover_the_busy_time_between_iterations(engine, prompts):
    """An iteration sample is the wall time since the previous iteration ended while the batch was
    busy (time a replica spends around its forward pass counts), less prefills in between; time
    before an abort or a weight load, and idle time with no running sequence, do not count."""
    import time

    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    for r in _reqs(prompts[:2], sp):
        engine.submit(r)
    engine.step()  # prefill: the batch turns busy
    engine.step()
    engine.stats()
    time.sleep(0.2)  # the replica is busy but not iterating (device loop, polls, contention)
    engine.step()
    it = engine.stats().iterations
    assert len(it) == 1 and it[0].seconds >= 0.2 and engine.last_forward_s < 0.2
    # a resume admitted between iterations: its prefill is a PrefillSample, not iteration time
    time.sleep(0.2)  # before an abort: not charged (the interval restarts at the abort's end)
    out = engine.abort([0])
    engine.submit(GenerationRequest(0, prompts[0], sp, generated=list(out[0])))
    engine.step()  # decode seq 1, then prefill the resumed seq 0
    engine.step()
    st = engine.stats()
    assert len(st.prefills) == 1 and [s.num_seqs for s in st.iterations] == [1, 2]
    assert all(s.seconds < 0.2 for s in st.iterations)
    engine.load_weights(dict(engine.model.state_dict()), 1)  # a weight load is timed by the runtime
    time.sleep(0.2)  # after the load: the replica is busy again, so this counts
    engine.step()
    assert engine.stats().iterations[0].seconds >= 0.2
    while engine.has_unfinished():
        engine.step()
    engine.stats()
    time.sleep(0.2)  # idle: no running sequence
    engine.submit(GenerationRequest(5, prompts[2], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)))
    engine.step()
    engine.step()
    it = engine.stats().iterations
    assert len(it) == 1 and it[0].seconds < 0.2


def test_submit_does_not_wait_for_a_running_step(engine, prompts):
    """`submit` hands over under the intake lock only: a step holding the engine lock (a decode
    and prefill) does not hold up the driver's dispatch; the handed-over sequence is live at once
    (a duplicate is refused) and runs from the next step, tagged with the version it starts under."""
    import threading
    import time

    held, release = threading.Event(), threading.Event()

    def long_step():
        with engine._lock:
            held.set()
            release.wait(5)

    t = threading.Thread(target=long_step)
    t.start()
    held.wait(5)
    t0 = time.perf_counter()
    engine.submit(GenerationRequest(1, prompts[0], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)))
    assert time.perf_counter() - t0 < 1.0
    with pytest.raises(ValueError, match="seq_id 1 is already live"):
        engine.submit(GenerationRequest(1, prompts[0], GREEDY))
    release.set()
    t.join()
    engine.load_weights(dict(engine.model.state_dict()), 3)
    assert engine.has_unfinished() and list(engine.snapshot()) == [1]
    done = []
    while engine.has_unfinished():
        done += engine.step()
    assert [(c.seq_id, len(c.token_ids), c.version) for c in done] == [(1, 4, 3)]
    engine.submit(GenerationRequest(1, prompts[0], GREEDY))  # finished: no longer live
    assert list(engine.abort([1])) == [1] and not engine.has_unfinished()


def test_submit_errors(tiny_dir, prompts):
    limit = len(prompts[0]) + 10
    eng = CPUEngine(tiny_dir, EngineConfig(name="cpu", max_model_len=limit))
    eng.submit(GenerationRequest(1, prompts[1], GREEDY))
    with pytest.raises(ValueError, match="seq_id 1 is already live"):
        eng.submit(GenerationRequest(1, prompts[1], GREEDY))
    with pytest.raises(ValueError, match=f"max_model_len={limit}"):
        eng.submit(GenerationRequest(2, list(range(10, 10 + limit)), GREEDY))
    # A sequence reaching max_model_len stops with `length`.
    c = eng.generate([GenerationRequest(3, prompts[0], SamplingParams(temperature=0, max_tokens=24, ignore_eos=True))])[0]
    assert c.finish_reason == FINISH_LENGTH and len(prompts[0]) + len(c.token_ids) == limit


def test_release_and_reacquire_memory(engine, tiny_dir_b, uninterrupted, prompts):
    from transformers import AutoModelForCausalLM

    engine.submit(_reqs(prompts)[0])
    engine.step()
    with pytest.raises(RuntimeError, match="abort them first"):
        engine.release_memory()
    engine.abort()
    engine.release_memory()
    assert engine.model is None and engine.stats().memory_released
    with pytest.raises(RuntimeError, match="released"):
        engine.submit(_reqs(prompts)[0])
    engine.reacquire_memory()  # from the folder: initial weights and version
    assert [c.token_ids for c in engine.generate(_reqs(prompts))] == [c.token_ids for c in uninterrupted]
    engine.release_memory()
    sd_b = AutoModelForCausalLM.from_pretrained(str(tiny_dir_b)).state_dict()
    engine.reacquire_memory(sd_b, version=3)  # as from a GPS read
    out = engine.generate(_reqs(prompts[:1]))[0]
    assert out.version == 3 and out.token_ids != uninterrupted[0].token_ids


def test_abort_from_another_thread_while_driver_steps(engine, prompts):
    """The Ray-actor shape: one thread drives `step()`, another aborts and resumes."""
    import threading
    import time

    sp = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)  # long: abort lands mid-flight
    reference = [c.token_ids for c in engine.generate(_reqs(prompts, sp))]
    done, stop = {}, threading.Event()

    def drive():
        while not stop.is_set():
            for c in engine.step():
                done[c.seq_id] = c
            time.sleep(0.0005)  # like the device actor's loop: let other threads in between steps

    for r in _reqs(prompts, sp):
        engine.submit(r)
    t = threading.Thread(target=drive)
    t.start()
    try:
        deadline = time.time() + 120  # never hang the suite, whatever the scheduling
        while time.time() < deadline and not any(len(v) >= 4 for v in engine.snapshot().values()):
            time.sleep(0.001)
        aborted = engine.abort([0, 1, 2])
        assert aborted, "the driver finished before the abort (machine extremely slow?)"
        for sid, toks in aborted.items():
            assert toks == reference[sid][:len(toks)]
            engine.submit(GenerationRequest(sid, prompts[sid], sp, generated=toks))
        while time.time() < deadline and len(done) < len(prompts):
            time.sleep(0.001)
    finally:
        stop.set()
        t.join()
    assert [done[i].token_ids for i in range(len(prompts))] == reference


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.sets(st.integers(0, 5))),
                     min_size=1, max_size=6))
def test_random_abort_resume_schedules_never_change_greedy_output(engine, uninterrupted, prompts, plan):
    """Property: any schedule of submits, steps, aborts and resumes gives the uninterrupted greedy
    tokens, and a sequence's token count never decreases across an abort."""
    engine.abort()
    engine.stats()
    held: dict[int, list[int]] = {}  # aborted, waiting to be resumed
    submitted: set[int] = set()
    done = {}
    for submit_id, steps, abort_ids in plan:
        if submit_id not in submitted:
            engine.submit(GenerationRequest(submit_id, prompts[submit_id], GREEDY))
            submitted.add(submit_id)
        for sid in list(held):  # resume what an earlier round aborted
            engine.submit(GenerationRequest(sid, prompts[sid], GREEDY, generated=held.pop(sid)))
        for _ in range(steps):
            done.update({c.seq_id: c for c in engine.step()})
        before = engine.snapshot()
        for sid, toks in engine.abort(abort_ids).items():
            assert len(toks) >= len(before.get(sid, [])) and toks == before[sid]
            held[sid] = toks
    for sid, toks in held.items():
        engine.submit(GenerationRequest(sid, prompts[sid], GREEDY, generated=toks))
    while engine.has_unfinished():
        done.update({c.seq_id: c for c in engine.step()})
    assert sorted(done) == sorted(submitted)
    for sid, c in done.items():
        assert c.token_ids == uninterrupted[sid].token_ids, sid


# ---------------------------------------------------------------------- behaviour log-probs
def hf_logprobs(model_dir, prompt_ids: list[int], response_ids: list[int], temperature: float) -> list[float]:
    """Reference: one `transformers` forward over prompt + response, `log_softmax(logits / T)` at
    each response token (T = 1 for greedy, the protocol's convention)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    ids = torch.tensor([prompt_ids + response_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float()
    T = temperature if temperature > 0 else 1.0
    lp = torch.log_softmax(logits[len(prompt_ids) - 1: len(prompt_ids) - 1 + len(response_ids)] / T, dim=-1)
    return lp.gather(1, torch.tensor(response_ids)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_logprobs_equal_transformers_log_softmax(engine, tiny_dir, prompts, temperature):
    sp = SamplingParams(temperature=temperature, max_tokens=16, seed=3)
    out = engine.generate(_reqs(prompts[:4], sp))  # batched with left padding: must not matter
    for c, p in zip(out, prompts):
        assert c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
        ref = hf_logprobs(tiny_dir, p, c.token_ids, temperature)
        assert c.logprobs == pytest.approx(ref, abs=2e-4), (c.seq_id, temperature)
        assert all(x <= 0 for x in c.logprobs)
    if temperature == 0.7:  # the tempered softmax, not the raw one: T really enters
        raw = hf_logprobs(tiny_dir, prompts[0], out[0].token_ids, 1.0)
        assert max(abs(a - b) for a, b in zip(out[0].logprobs, raw)) > 1e-2


def test_logprobs_survive_abort_and_resume(engine, tiny_dir, prompts):
    """Sampled (seeded) sequences aborted mid-flight and resumed: the completion's log-probs cover
    the whole response and still equal the reference, and abort/snapshot carry them."""
    from pivotrl.engines.protocol import TokensSoFar

    sp = SamplingParams(temperature=1.0, max_tokens=20, seed=11)
    for r in _reqs(prompts[:3], sp):
        engine.submit(r)
    for _ in range(6):
        assert not engine.step()  # 20-token budget: nothing finishes in 6 steps unless EOS
    snap = engine.snapshot([1])
    assert isinstance(snap[1], TokensSoFar) and len(snap[1].logprobs) == len(snap[1]) == 6
    aborted = engine.abort([0, 1])
    assert all(isinstance(t, TokensSoFar) and len(t.logprobs) == len(t) == 6 for t in aborted.values())
    assert aborted[1].logprobs == snap[1].logprobs
    for sid, toks in aborted.items():  # the TokensSoFar hands its log-probs to the request
        engine.submit(GenerationRequest(sid, prompts[sid], sp, generated=toks))
    done = {}
    while engine.has_unfinished():
        done.update({c.seq_id: c for c in engine.step()})
    for sid, c in done.items():
        assert len(c.logprobs) == len(c.token_ids)
        assert c.token_ids[:6] == list(aborted.get(sid, c.token_ids[:6]))
        assert c.logprobs == pytest.approx(hf_logprobs(tiny_dir, prompts[sid], c.token_ids, 1.0), abs=2e-4)


def test_resume_without_logprobs_reports_unknown(engine, prompts):
    toks = engine.generate(_reqs(prompts[:1]))[0].token_ids[:3]
    c = engine.generate([GenerationRequest(7, prompts[0], GREEDY, generated=toks)])[0]
    assert c.logprobs is None  # unknown, never silently partial
    with pytest.raises(ValueError, match="generated_logprobs"):
        GenerationRequest(8, prompts[0], GREEDY, generated=toks, generated_logprobs=[0.0])


def test_tokens_so_far_pickles_with_logprobs():
    import pickle

    from pivotrl.engines.protocol import TokensSoFar

    t = pickle.loads(pickle.dumps(TokensSoFar([3, 4], [-0.5, -1.25])))
    assert t == [3, 4] and t.logprobs == [-0.5, -1.25]
    with pytest.raises(ValueError, match="log-probs"):
        TokensSoFar([1, 2], [0.0])


def test_new_tokens_report_each_token_once(engine, prompts):
    """The progress reporting the runtime polls (`new_tokens`): deltas since the last report."""
    from .conftest import check_new_tokens

    check_new_tokens(engine, prompts, base=0, step_timeout=None)


def test_shift_down_frees_cache_and_model_without_a_collection(engine, prompts):
    """`release_memory` runs no `gc.collect()` (0.19 CPU-s per shift down): the KV cache and,
    at level 2, the model hold no reference cycles, so they are gone once released."""
    import gc
    import weakref

    sp = SamplingParams(temperature=1.0, max_tokens=50, ignore_eos=True)
    for i, p in enumerate(prompts[:3]):
        engine.submit(GenerationRequest(i, p, sp))
    engine.step()
    engine.step()
    gc.collect()
    gc.disable()
    try:
        cache, model = weakref.ref(engine._batch.cache), weakref.ref(engine.model)
        engine.abort()
        engine.release_memory(2)
        assert cache() is None and model() is None
    finally:
        gc.enable()


def test_a_recurrent_hybrid_judge_runs_row_by_row_and_matches_transformers(tmp_path, tiny_dir, prompts):
    """A tiny Qwen3.5-MoE (gated-delta-net layers beside attention: a cache with no time axis)
    runs on per-row caches: greedy equals transformers' generate, also when sequences join
    mid-flight and after an abort and resume; a Qwen2 model keeps the shared padded cache."""
    from pivotrl.engines.cpu_batch import KVBatch, RowCacheBatch
    from pivotrl.models.tiny_families import make_tiny_checkpoint

    path = make_tiny_checkpoint("qwen3_5_moe", tmp_path / "q35", seed=4)
    eng = CPUEngine(path, EngineConfig(name="cpu", num_threads=1))
    assert type(eng._batch) is RowCacheBatch
    sp = SamplingParams(temperature=0, max_tokens=8)
    want = [hf_greedy(path, p, 8) for p in prompts[:3]]
    assert len({tuple(w) for w in want}) > 1
    eng.submit(GenerationRequest(0, prompts[0], sp))
    done = {c.seq_id: c for c in eng.step()}
    for i in (1, 2):  # joins while row 0 is decoding
        eng.submit(GenerationRequest(i, prompts[i], sp))
    done.update({c.seq_id: c for c in eng.step()})
    got = eng.abort([1])[1]  # abort one, resume it with its tokens so far
    eng.submit(GenerationRequest(1, prompts[1], sp, generated=list(got), resumed=True))
    while eng.has_unfinished():
        done.update({c.seq_id: c for c in eng.step()})
    assert [done[i].token_ids for i in range(3)] == want
    assert type(CPUEngine(tiny_dir, EngineConfig(name="cpu"))._batch) is KVBatch
