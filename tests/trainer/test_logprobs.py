"""Chunked log-probs and entropy equal the full-logits computation, values and gradients."""
from __future__ import annotations

import pytest
import torch

from pivotrl.trainer.logprobs import HiddenStateHead, chunked_log_probs, install_hidden_head, response_rows


def _full(h, w, b, t, temp):
    logp_all = torch.log_softmax(torch.nn.functional.linear(h, w, b).float() / temp, dim=-1)
    return logp_all.gather(-1, t[:, None]).squeeze(-1), -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("chunk", [1, 7, 64, 1000])
@pytest.mark.parametrize("bias", [False, True])
def test_chunked_equals_full_values_and_gradients(chunk, bias):
    g = torch.Generator().manual_seed(chunk)
    n, hdim, vocab = 37, 16, 50
    h = torch.randn(n, hdim, generator=g, requires_grad=True)
    w = torch.randn(vocab, hdim, generator=g, requires_grad=True)
    b = torch.randn(vocab, generator=g, requires_grad=True) if bias else None
    t = torch.randint(0, vocab, (n,), generator=g)
    coef = torch.randn(n, generator=g)
    ref_lp, ref_ent = _full(h, w, b, t, 0.7)
    (ref_lp * coef).sum().backward()
    ref_grads = [x.grad.clone() for x in (h, w, b) if x is not None]
    for x in (h, w, b):
        if x is not None:
            x.grad = None
    lp, ent = chunked_log_probs(h, w, b, t, chunk_tokens=chunk, temperature=0.7, entropy=True)
    torch.testing.assert_close(lp, ref_lp)
    torch.testing.assert_close(ent, ref_ent.detach())
    assert not ent.requires_grad
    (lp * coef).sum().backward()
    for got, want in zip([x.grad for x in (h, w, b) if x is not None], ref_grads):
        torch.testing.assert_close(got, want)


def test_no_grad_and_empty_inputs():
    w = torch.randn(10, 4)
    with torch.no_grad():
        lp, ent = chunked_log_probs(torch.randn(3, 4), w, None, torch.tensor([1, 2, 3]), chunk_tokens=2)
    assert lp.shape == (3,) and ent is None and (lp < 0).all()
    lp, ent = chunked_log_probs(torch.zeros(0, 4), w, None, torch.zeros(0, dtype=torch.long), chunk_tokens=2,
                                entropy=True)
    assert lp.shape == (0,) and ent.shape == (0,)
    with pytest.raises(ValueError, match="chunk_tokens"):
        chunked_log_probs(torch.randn(3, 4), w, None, torch.tensor([1, 2, 3]), chunk_tokens=0)


def test_response_rows_skip_prompt_and_padding():
    src, tgt = response_rows([2, 1], [3, 1], seq_len=5)
    # sample 0: positions 1,2,3 predict tokens at 2,3,4; sample 1 (offset 5): position 0 predicts 1
    assert src.tolist() == [1, 2, 3, 5] and tgt.tolist() == [2, 3, 4, 6]


def test_hidden_head_keeps_parameters_and_tying():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                      num_key_value_heads=1, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    names = list(model.state_dict())
    ids = torch.randint(0, 40, (2, 5))
    logits = model(input_ids=ids).logits
    head = install_hidden_head(model)
    assert isinstance(head, HiddenStateHead) and head.weight is model.get_input_embeddings().weight
    assert list(model.state_dict()) == names
    torch.testing.assert_close(model(input_ids=ids).logits, logits)  # pass_hidden off: plain linear
    head.pass_hidden = True
    hidden = model(input_ids=ids).logits
    assert hidden.shape == (2, 5, 16) and head.live_weight is head.weight
    torch.testing.assert_close(torch.nn.functional.linear(hidden, head.live_weight), logits)
