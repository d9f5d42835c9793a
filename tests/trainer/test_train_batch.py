"""`TrainBatch` on the wire: per-token fields travel as flat arrays and come back unchanged."""
from __future__ import annotations

import pickle

import numpy as np

from pivotrl.trainer.train_batch import PackedRows, TrainBatch


def _batch(with_logprobs: bool = True) -> TrainBatch:
    rows = [[5, 6, 7], [], [150_000, 1]]
    return TrainBatch(prompt_ids=[[1, 2], [3], [4, 4, 4]], response_ids=rows, versions=[0, 1, 1],
                      rewards=[1.0, 0.0, 0.5], group_ids=["a", "a", 7],
                      old_log_probs=[[-0.1, -1e-12, -3.25], [], [-2.0, -0.3]] if with_logprobs else None)


def test_pickled_batch_is_identical_and_carries_arrays_out_of_band():
    for b in (_batch(), _batch(with_logprobs=False)):
        buffers: list = []
        data = pickle.dumps(b, protocol=5, buffer_callback=buffers.append)
        back = pickle.loads(data, buffers=buffers)
        assert back == b
        assert all(type(x) is int for r in back.response_ids for x in r)
        if b.old_log_probs is not None:  # float64 on the wire: the very same values
            assert back.old_log_probs == b.old_log_probs and type(back.old_log_probs[0][0]) is float
        # the per-token fields are raw buffers (values + offsets of each), not pickled Python lists
        assert len(buffers) == (6 if b.old_log_probs is not None else 4)
        assert len(data) < 1500


def test_packed_rows_round_trip_and_token_width():
    p = _batch().packed()
    assert isinstance(p["response_ids"], PackedRows) and p["response_ids"].values.dtype == np.int32
    assert p["response_ids"].offsets.tolist() == [0, 3, 3, 5]
    assert p["response_ids"].unpack() == _batch().response_ids
    big = TrainBatch(prompt_ids=[[2**40]], response_ids=[[1]], versions=[0], advantages=[1.0]).packed()
    assert big["prompt_ids"].values.dtype == np.int64 and big["prompt_ids"].unpack() == [[2**40]]
