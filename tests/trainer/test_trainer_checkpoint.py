"""Asynchronous trainer checkpoints (`pivotrl.trainer.trainer_checkpoint`) on real FSDP2 ranks (gloo, CPU).

One 2-rank scenario (spawned processes) covers the collective parts: a write held back while the
next step, an offload and a reload run; a failing rank-0 part surfacing on both ranks; a process
killed mid-write. The write is held by wrapping DCP's `save`, which the upload thread calls after
`async_save` staged the state, so "the step ran during the write" is certain, not a race. The
1-rank tests host the rank in this process.
"""
from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch

from pivotrl.trainer import trainer_checkpoint
from pivotrl.trainer.trainer import Trainer
from pivotrl.trainer.trainer_checkpoint import CheckpointError, checkpoint_dir, latest_checkpoint
from pivotrl.models.tiny import create_tiny_model
from tests.trainer.test_trainer import TINY, _assert_state_close, _batch, _cfg

torch.set_num_threads(1)



@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return create_tiny_model(tmp_path_factory.mktemp("tiny") / "policy", TINY, seed=0)


class _HeldWrites:
    """Wraps DCP's `save` (what `async_save`'s upload thread runs on the staged copy) so that it
    waits until `release()`: the background write cannot start before the test lets it."""

    def __init__(self):
        import torch.distributed.checkpoint.state_dict_saver as saver

        self._saver, self._real, self._gate = saver, saver.save, threading.Event()

        def held(*args, **kwargs):
            if not self._gate.wait(120):
                raise RuntimeError("test gate never released")
            return self._real(*args, **kwargs)

        saver.save = held

    def release(self) -> None:
        self._gate.set()

    def restore(self) -> None:
        self._gate.set()
        self._saver.save = self._real


def _scenario(rank: int, init: str, model_path: str, root: str, out: str) -> None:
    """One rank of the 2-rank scenario; rank 0 writes its observations to `out`, both exit with
    os._exit(0) while a save is held in its background (a process killed mid-write)."""
    import torch.distributed as dist

    from pivotrl.trainer.dist import init_process_group
    from pivotrl.trainer.trainer_worker import TrainerWorker

    torch.set_num_threads(1)
    init_process_group(rank, 2, init, "gloo", 120.0)
    root_p = Path(root)
    res: dict = {}
    w = TrainerWorker(_cfg(world_size=2), model_path)
    w.step(_batch(1))
    res["sd1"] = w.full_state_dict("float32")
    res["sync"] = w.save_checkpoint(root_p / "sync_1", {"cursor": 1})
    assert res["sync"] == str(root_p / "sync_1") and w.checkpoint_pending() is None
    rng_before = torch.get_rng_state()

    # 1. an asynchronous save, held in the background while a step, an offload and a reload run
    held = _HeldWrites()
    a1 = checkpoint_dir(root_p, 1)
    res["returned"] = w.save_checkpoint(a1, {"cursor": 1}, blocking=False)
    res["pending"] = w.checkpoint_pending()
    t0 = time.perf_counter()
    try:
        w.wait_checkpoint(timeout_s=0.3)
    except TimeoutError as e:
        res["timeout"] = str(e)
    res["timeout_waited_s"] = time.perf_counter() - t0
    res["m2"] = w.step(_batch(2, version=1))  # changes parameters and optimizer state mid-write
    w.offload()
    res["complete_after_offload"] = (a1 / "trainer_state.json").exists()
    held.release()
    res["waited"] = w.wait_checkpoint()
    held.restore()
    res["rng_unchanged"] = torch.equal(torch.get_rng_state(), rng_before)
    w.reload()
    res["sd2"] = w.full_state_dict("float32")

    # 2. resume on 2 ranks from the asynchronous checkpoint: the same next step, bit for bit
    res["extra"] = w.load_checkpoint(a1)
    res["m2_resumed"] = w.step(_batch(2, version=1))
    res["sd2_resumed"] = w.full_state_dict("float32")

    # 3. rank 0's part fails (hf/ is a file): both ranks learn it at their next checkpoint call
    bad = checkpoint_dir(root_p, 2)
    if rank == 0:
        bad.mkdir()
        (bad / "hf").write_text("not a folder")
    dist.barrier()
    w.save_checkpoint(bad, {"cursor": 2}, blocking=False)
    try:
        w.save_checkpoint(checkpoint_dir(root_p, 3), {"cursor": 3}, blocking=False)
        res["error"] = None
    except CheckpointError as e:
        res["error"], res["error_path"] = str(e), str(e.path)
    errors: list = [None, None]
    dist.all_gather_object(errors, res["error"])
    res["both_raised"] = all(e is not None and str(bad) in e for e in errors)
    res["after_error"] = w.wait_checkpoint()  # the failure was raised once, then cleared
    res["step3_started"] = checkpoint_dir(root_p, 3).exists()

    # 3b. rank 1's part fails (its RNG file's name is taken by a folder), in a blocking save:
    # both ranks raise, and rank 1 still joined the shards' collectives (no hang)
    bad_rng = checkpoint_dir(root_p, 5)
    if rank == 0:
        (bad_rng / "rng" / "rank_1.pt").mkdir(parents=True)
    dist.barrier()
    try:
        w.save_checkpoint(bad_rng, {"cursor": 5})
        mine = None
    except CheckpointError as e:
        mine = str(e)
    rng_errors: list = [None, None]
    dist.all_gather_object(rng_errors, mine)
    res["rng_errors"] = rng_errors

    # 4. killed mid-write: the shards are on disk, rank 0 is writing hf/, then the processes die
    in_hf = threading.Event()

    def stuck_hf(*args, **kwargs):
        in_hf.set()
        threading.Event().wait(600)

    trainer_checkpoint._save_hf = stuck_hf
    w.save_checkpoint(checkpoint_dir(root_p, 4), {"cursor": 4}, blocking=False)
    if rank == 0:
        res["reached_hf"] = in_hf.wait(120)
        torch.save(res, out)
    dist.barrier()
    os._exit(0)


@pytest.fixture(scope="module")
def two_ranks(model_path, tmp_path_factory):
    from pivotrl.trainer.dist import rank_process

    tmp = tmp_path_factory.mktemp("ckpt_async2")
    root, out = tmp / "ckpts", tmp / "rank0.pt"
    procs = [rank_process(_scenario, (r, f"file://{tmp}/pg", str(model_path), str(root), str(out)))
             for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=400)
    for p in procs:
        if p.is_alive():
            p.kill()
    assert [p.exitcode for p in procs] == [0, 0]
    return {"root": root, **torch.load(out, weights_only=False)}


def test_async_save_returns_before_the_write_and_snapshots_the_step(two_ranks, model_path):
    r, root = two_ranks, two_ranks["root"]
    a1 = checkpoint_dir(root, 1)
    assert r["returned"] is None and r["pending"] == str(a1)
    assert str(a1) in r["timeout"] and r["timeout_waited_s"] < 5  # bounded wait, names the folder
    assert r["complete_after_offload"] is False  # offload did not wait for the held write
    assert r["waited"] == str(a1) and r["rng_unchanged"]
    # The step ran while the write was held, yet the checkpoint holds the weights before it.
    assert max((r["sd2"][k] - r["sd1"][k]).abs().max() for k in r["sd1"]) > 1e-3
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(a1 / "hf")).state_dict()
    _assert_state_close({k: hf[k] for k in r["sd1"]}, r["sd1"])
    assert json.loads((a1 / "trainer_state.json").read_text())["version"] == 1
    assert json.loads((a1 / "extra.json").read_text()) == {"cursor": 1}


def test_async_checkpoint_resumes_like_the_sync_one(two_ranks, model_path):
    r, root = two_ranks, two_ranks["root"]
    a1, s1 = checkpoint_dir(root, 1), root / "sync_1"
    # On 2 ranks: resuming from the asynchronous checkpoint repeats the step exactly.
    assert r["extra"] == {"cursor": 1}
    assert r["m2_resumed"]["loss"] == r["m2"]["loss"] and r["m2_resumed"]["grad_norm"] == r["m2"]["grad_norm"]
    _assert_state_close(r["sd2_resumed"], r["sd2"])
    # The two files of each rank's RNG and the trainer state are the same as the sync save's.
    assert (a1 / "trainer_state.json").read_text() == (s1 / "trainer_state.json").read_text()
    for rank in (0, 1):
        ra, rs = (torch.load(p / "rng" / f"rank_{rank}.pt", weights_only=False) for p in (a1, s1))
        assert torch.equal(ra["torch"], rs["torch"]) and ra["python"] == rs["python"]
    # Resharded onto 1 rank: async and sync checkpoints give the same weights, moments and next step.
    seen = []
    for path in (a1, s1):
        with Trainer(_cfg(), model_path) as tr:
            assert tr.load_checkpoint(path) == {"cursor": 1} and tr.version == 1
            sd = tr.state_dict()
            m = tr.step(_batch(2, version=1))
            seen.append((sd, m, tr.state_dict()))
    (sd_a, m_a, after_a), (sd_s, m_s, after_s) = seen
    _assert_state_close(sd_a, sd_s)
    _assert_state_close(sd_a, r["sd1"])
    assert m_a["loss"] == m_s["loss"] and m_a["grad_norm"] == m_s["grad_norm"]
    _assert_state_close(after_a, after_s)
    assert m_a["loss"] == pytest.approx(r["m2"]["loss"], rel=1e-4)


def test_a_failed_write_surfaces_on_every_rank_and_is_never_complete(two_ranks):
    r, root = two_ranks, two_ranks["root"]
    bad = checkpoint_dir(root, 2)
    assert r["error_path"] == str(bad) and r["both_raised"]
    assert "rank 0: hf/ or extra.json: FileExistsError" in r["error"]
    assert r["after_error"] is None and not r["step3_started"]  # the raising call started nothing
    assert (bad / "dcp" / ".metadata").is_file() and not (bad / "trainer_state.json").exists()
    # A non-zero rank's failure (its RNG file), in a blocking save, reaches rank 0 as well.
    bad_rng = checkpoint_dir(root, 5)
    assert all(e is not None and str(bad_rng) in e and "rank 1: rng/" in e for e in r["rng_errors"]), r["rng_errors"]
    assert not (bad_rng / "trainer_state.json").exists()


def test_a_process_killed_mid_write_leaves_no_complete_checkpoint(two_ranks, model_path):
    r, root = two_ranks, two_ranks["root"]
    killed = checkpoint_dir(root, 4)
    assert r["reached_hf"]  # the shards and both RNG files were on disk when the processes died
    assert (killed / "dcp" / ".metadata").is_file() and (killed / "rng" / "rank_1.pt").is_file()
    assert not (killed / "trainer_state.json").exists()
    assert latest_checkpoint(root) == checkpoint_dir(root, 1)  # steps 2, 5 (failed) and 4 (killed) skipped
    with Trainer(_cfg(), model_path) as tr:
        with pytest.raises(ValueError, match="no trainer_state.json"):
            tr.worker.load_checkpoint(killed)
        assert tr.load_checkpoint(root) == {"cursor": 1}


# ------------------------------------------------------------------------ one rank, in-process
def test_a_new_save_waits_for_the_one_in_flight(model_path, tmp_path):
    with Trainer(_cfg(), model_path) as tr:
        w = tr.worker
        tr.step(_batch(1))
        held = _HeldWrites()
        try:
            w.save_checkpoint(checkpoint_dir(tmp_path, 1), blocking=False)
            threading.Timer(0.5, held.release).start()
            w.save_checkpoint(checkpoint_dir(tmp_path, 1).with_name("second"), blocking=False)
            # the second start returned, so the first had finished: one write in flight at a time
            assert (checkpoint_dir(tmp_path, 1) / "trainer_state.json").is_file()
            assert w.checkpoint_pending() == str(tmp_path / "second")
            assert w.wait_checkpoint() == str(tmp_path / "second") and w.checkpoint_pending() is None
        finally:
            held.restore()


def test_close_and_load_wait_for_the_write(model_path, tmp_path):
    with Trainer(_cfg(), model_path) as tr:
        tr.step(_batch(1))
        sd1 = tr.state_dict()
        held = _HeldWrites()
        try:
            tr.worker.save_checkpoint(checkpoint_dir(tmp_path, 1), {"cursor": 7}, blocking=False)
            tr.step(_batch(2, version=1))
            threading.Timer(0.5, held.release).start()
            assert tr.worker.load_checkpoint(checkpoint_dir(tmp_path, 1)) == {"cursor": 7}  # waited, then loaded
            _assert_state_close(tr.state_dict(), sd1)
            held = _HeldWrites()
            tr.worker.save_checkpoint(checkpoint_dir(tmp_path, 2), blocking=False)
            threading.Timer(0.5, held.release).start()
            tr.worker.close()
            assert (checkpoint_dir(tmp_path, 2) / "trainer_state.json").is_file()
        finally:
            held.restore()


def test_bad_extra_fails_before_writing_and_a_stale_folder_stops_being_complete(model_path, tmp_path):
    with Trainer(_cfg(), model_path) as tr:
        w = tr.worker
        with pytest.raises(TypeError, match="not JSON serializable"):
            w.save_checkpoint(tmp_path / "bad", {"cursor": object()}, blocking=False)
        assert not (tmp_path / "bad").exists() and w.checkpoint_pending() is None
        old = checkpoint_dir(tmp_path, 5)
        assert w.save_checkpoint(old, {"cursor": 0}) == str(old)
        # Overwriting a complete checkpoint: its marker goes before the first byte is rewritten.
        held = _HeldWrites()
        try:
            w.save_checkpoint(old, {"cursor": 1}, blocking=False)
            assert not (old / "trainer_state.json").exists() and latest_checkpoint(tmp_path) is None
            held.release()
            assert w.wait_checkpoint() == str(old)
        finally:
            held.restore()
        assert json.loads((old / "extra.json").read_text()) == {"cursor": 1} and latest_checkpoint(tmp_path) == old


def test_close_without_waiting_returns_while_the_write_is_held(model_path, tmp_path):
    with Trainer(_cfg(), model_path) as tr:
        tr.step(_batch(1))
        held = _HeldWrites()
        try:
            tr.worker.save_checkpoint(checkpoint_dir(tmp_path, 1), blocking=False)
            t0 = time.perf_counter()
            tr.worker.close(wait=False)  # a peer died: nothing to wait for
            assert time.perf_counter() - t0 < 5 and tr.worker.checkpoint_pending() is None
            assert not (checkpoint_dir(tmp_path, 1) / "trainer_state.json").exists()
        finally:
            held.restore()


# ------------------------------------------------------------------------ resume verifies first
def _cut_shard(ck: Path) -> None:
    shard = next(p for p in sorted((ck / "dcp").iterdir()) if p.suffix == ".distcp")
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def _cut_hf(ck: Path) -> None:
    (f,) = sorted((ck / "hf").glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[:100])


DAMAGE = {
    "trainer_state.json is damaged": lambda ck: (ck / "trainer_state.json").write_text('{"version": 2, "coun'),
    "no dcp/.metadata": lambda ck: __import__("shutil").rmtree(ck / "dcp"),
    "is cut short": _cut_shard,
    "hf/ is incomplete": _cut_hf,
    "extra.json is damaged": lambda ck: (ck / "extra.json").write_text("{"),
}


@pytest.fixture(scope="module")
def two_checkpoints(model_path, tmp_path_factory):
    """Complete checkpoints at versions 1 and 2 of one in-process rank (copied per test)."""
    root = tmp_path_factory.mktemp("two_ckpts")
    with Trainer(_cfg(), model_path) as tr:
        tr.step(_batch(1))
        tr.worker.save_checkpoint(checkpoint_dir(root, 1), {"cursor": 1})
        tr.step(_batch(2, version=1))
        tr.worker.save_checkpoint(checkpoint_dir(root, 2), {"cursor": 2})
    return root


@pytest.mark.parametrize("why", list(DAMAGE))
def test_resume_skips_a_newest_checkpoint_that_does_not_verify(two_checkpoints, tmp_path, why, caplog):
    """Issue 22: a truncated trainer_state.json gave a bare JSONDecodeError and a missing dcp/ a
    torch AssertionError from a device; the resume now takes the previous complete checkpoint and
    says which one it skipped and why."""
    import logging
    import shutil

    from pivotrl.trainer.trainer_checkpoint import verify_checkpoint

    root = Path(shutil.copytree(two_checkpoints, tmp_path / "ckpts"))
    assert verify_checkpoint(checkpoint_dir(root, 2)) is None and latest_checkpoint(root) == checkpoint_dir(root, 2)
    DAMAGE[why](checkpoint_dir(root, 2))
    assert why in verify_checkpoint(checkpoint_dir(root, 2))
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(root) == checkpoint_dir(root, 1)
    assert f"checkpoint {checkpoint_dir(root, 2)} is skipped: " in caplog.text and why in caplog.text
    assert "trying the previous one, step_00000001" in caplog.text
    DAMAGE[why](checkpoint_dir(root, 1))
    assert latest_checkpoint(root) is None
