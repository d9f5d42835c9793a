"""The trainer's state in host memory (`pivotrl.trainer.state_store`), resharded between world sizes.

- In this process (one rank, an in-process GPS): a state written and read back into a trainer built
  without weights is the same trainer, bit for bit: weights, AdamW's moments and step, version,
  counters and RNG, and the next step gives the same loss and weights.
- Learning parity (issue 23): the state written by one rank is read by four spawned ranks (gloo,
  Ray's GPS shared by every process) and by one rank here; the same step on the same batch gives
  the same loss within float tolerance (same math, different sharding), and the four ranks' state,
  written back, reads into one rank as the one-rank step's state (W=1 -> 4 -> 1 through host memory).
"""
from __future__ import annotations

import pytest
import torch

from pivotrl.config.gps import GPSConfig
from pivotrl.gps.store import GlobalParameterStore
from pivotrl.models.tiny import create_tiny_model
from tests.trainer.test_trainer import TINY, _batch, _cfg

torch.set_num_threads(1)

NAME = "policy.train_state"


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "policy", TINY, seed=0)


def _full_state(worker) -> dict[str, torch.Tensor]:
    """Weights and AdamW moments of a one-rank worker by name (its shards are whole tensors)."""
    out = {}
    for n, p in worker.model.named_parameters():
        out[n] = p.detach().full_tensor().clone() if hasattr(p, "full_tensor") else p.detach().clone()
        for k, v in worker.optimizer.state.get(p, {}).items():
            if torch.is_tensor(v):
                out[f"{n}::{k}"] = v.full_tensor().clone() if hasattr(v, "full_tensor") else v.clone()
    return out


@pytest.fixture
def one_rank(tmp_path):
    """This process as the single rank of a gloo group (torn down after the test)."""
    import torch.distributed as dist

    from pivotrl.trainer.dist import init_process_group

    init_process_group(0, 1, f"file://{tmp_path}/pg", "gloo", 120.0)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_state_round_trip_is_the_same_trainer(model_path, one_rank):
    from pivotrl.trainer.state_store import register_state, state_spec
    from pivotrl.trainer.trainer_worker import TrainerWorker

    store = GlobalParameterStore(GPSConfig())
    try:
        nbytes = register_state(store, NAME, model_path)
        spec = state_spec(model_path)
        params = sum(p.numel() for p in TrainerWorker(_cfg(kl_coef=0.0), model_path).model.parameters())
        assert nbytes == spec.nbytes and nbytes >= 12 * params  # weights + two moments, fp32, + meta

        a = TrainerWorker(_cfg(kl_coef=0.0), model_path)
        fresh = a.save_state(store, NAME)  # before any step: moments are zeros, AdamW's step 0
        assert fresh["gps_version"] == 0.0 and fresh["bytes"] > 0
        b = TrainerWorker(_cfg(kl_coef=0.0), model_path, load_weights=False)
        b.load_state(store, NAME)
        assert not b.optimizer.state and all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters()))

        a.step(_batch(1))
        torch.manual_seed(123)  # the RNG streams travel with the state
        w = a.save_state(store, NAME)
        want = _full_state(a)
        rng = torch.get_rng_state()
        torch.manual_seed(7)
        c = TrainerWorker(_cfg(kl_coef=0.0), model_path, load_weights=False)
        r = c.load_state(store, NAME)
        assert r["gps_version"] == w["gps_version"] == 1.0 and store.live_versions(NAME) == [1]
        got = _full_state(c)
        assert got.keys() == want.keys() and any(k.endswith("::exp_avg_sq") for k in got)
        for k in want:
            assert torch.equal(got[k], want[k]), k
        assert torch.equal(torch.get_rng_state(), rng)
        assert (c.version, c.counters) == (a.version, a.counters)
        assert {float(s["step"]) for s in c.optimizer.state.values()} == {1.0}
        ma, mc = a.step(_batch(2, version=1)), c.step(_batch(2, version=1))
        assert ma["loss"] == mc["loss"] and ma["grad_norm"] == mc["grad_norm"]
        after_a, after_c = _full_state(a), _full_state(c)
        assert all(torch.equal(after_a[k], after_c[k]) for k in after_a)
    finally:
        store.close()


# ------------------------------------------------------------------------- 1 -> 4 -> 1 ranks
def _rank(rank: int, world: int, init: str, address: str, store_blob: bytes, folder: str, out: str) -> None:
    """One of four spawned ranks: read the state written by one rank, step, write it back."""
    import ray
    import torch.distributed as dist

    from pivotrl.trainer.dist import init_process_group
    from pivotrl.trainer.trainer_worker import TrainerWorker

    torch.set_num_threads(1)
    ray.init(address=address, logging_level="ERROR")
    store = ray.cloudpickle.loads(store_blob)
    init_process_group(rank, world, init, "gloo", 120.0)
    try:
        w = TrainerWorker(_cfg(kl_coef=0.0, world_size=world), folder, load_weights=False)
        read = w.load_state(store, NAME)
        m = w.step(_batch(2, version=1))
        wrote = w.save_state(store, NAME)
        if rank == 0:
            torch.save({"metrics": m, "read": read, "wrote": wrote}, out)
    finally:
        dist.destroy_process_group()
        ray.shutdown()


def test_learning_parity_one_rank_and_four_ranks_through_host_memory(model_path, ray_store, tmp_path, one_rank):
    import ray
    from pivotrl.trainer.state_store import register_state
    from pivotrl.trainer.dist import rank_process
    from pivotrl.trainer.trainer_worker import TrainerWorker

    register_state(ray_store, NAME, model_path)
    w1 = TrainerWorker(_cfg(kl_coef=0.0), model_path)
    w1.step(_batch(1))
    w1.save_state(ray_store, NAME)  # version 0: the state after one step, written by one rank
    base = _full_state(w1)

    out = str(tmp_path / "rank0.pt")
    blob, address = ray.cloudpickle.dumps(ray_store), ray.get_runtime_context().gcs_address
    procs = [rank_process(_rank, (r, 4, f"file://{tmp_path}/pg4", address, blob, str(model_path), out))
             for r in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    assert [p.exitcode for p in procs] == [0] * 4
    four = torch.load(out)
    assert four["read"]["gps_version"] == 0.0 and four["wrote"]["gps_version"] == 1.0

    # the same step at W=1 from the same stored state
    m1 = w1.step(_batch(2, version=1))
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "tokens_trained", "samples_trained"):
        assert four["metrics"][key] == pytest.approx(m1[key], rel=1e-4, abs=1e-6), key
    assert m1["loss"] != 0 and four["metrics"]["version"] == m1["version"] == 2

    # the four ranks' state, read by one rank: the one-rank step's state (Adam turns a rounding
    # difference of a near-zero gradient into up to lr: 1 % of lr allowed, as tests/trainer does)
    back = TrainerWorker(_cfg(kl_coef=0.0), model_path, load_weights=False)
    back.load_state(ray_store, NAME)
    got, want = _full_state(back), _full_state(w1)
    assert got.keys() == want.keys() == base.keys()
    for k in want:
        torch.testing.assert_close(got[k], want[k], atol=1e-4, rtol=1e-5, msg=lambda m, k=k: f"{k}: {m}")
    assert max((want[k] - base[k]).abs().max() for k in base if "::" not in k) > 1e-3  # and the step moved them
    assert back.version == 2 and back.counters["steps"] == 2
