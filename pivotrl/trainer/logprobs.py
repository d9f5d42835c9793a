"""Token log-probs and entropy from a causal LM without the full `[B, L, V]` float32 logits.

Owns: `HiddenStateHead` (the LM head module that hands the final hidden states through, so one
FSDP2 forward of the Hugging Face model returns hidden states instead of logits), `response_rows`
(which hidden positions predict which response tokens, padding removed), and
`chunked_log_probs` (log-softmax and entropy over the vocabulary, `chunk_tokens` rows at a time,
each chunk recomputed in backward instead of stored).

Why: for Qwen2.5-7B (vocabulary 152,064) one 16K-token sample's float32 logits are 10 GB, and
autograd keeps the logits, their log-softmax and its gradient. Chunked, the largest vocabulary
tensor is `[chunk_tokens, V]` float32 (1024 rows: 0.62 GB) and only the `[N, H]` hidden rows of
the response tokens are saved for backward. The same technique as verl's and slime's chunked
entropy / log-prob kernels, written here with plain torch (`torch.utils.checkpoint` per chunk).

Numerics: the head runs in the parameters' compute dtype (bf16 under mixed precision), the
log-softmax in float32, exactly like the full-logits path; in float32 the two agree to rounding.
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["HiddenStateHead", "chunked_log_probs", "response_rows", "install_hidden_head"]


class HiddenStateHead(torch.nn.Linear):
    """An `nn.Linear` LM head (same `weight`/`bias` parameters, so names, tying and FSDP sharding
    are unchanged) that, while `pass_hidden` is set, returns its input instead of the logits and
    remembers the weight it was called with (`live_weight`: under FSDP2 the unsharded parameter of
    this forward, which the root keeps gathered until its backward)."""

    pass_hidden: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102
        if self.pass_hidden:
            self.live_weight, self.live_bias = self.weight, self.bias
            return x
        return super().forward(x)

    def release(self) -> None:
        """Drop the references to the gathered parameters taken by the last forward."""
        self.live_weight = self.live_bias = None


def install_hidden_head(model: torch.nn.Module) -> HiddenStateHead:
    """Replace `model`'s output embedding (an `nn.Linear`) with a `HiddenStateHead` holding the
    very same parameters (tied embeddings stay tied). Call before `fully_shard`."""
    old = model.get_output_embeddings()
    if not isinstance(old, torch.nn.Linear):
        raise ValueError(f"{type(model).__name__}'s output embedding is a {type(old).__name__}, not nn.Linear: "
                         "chunked log-probs need a linear LM head (set TrainerConfig.logprob_chunk_tokens=0)")
    if isinstance(old, HiddenStateHead):
        return old
    head = HiddenStateHead(old.in_features, old.out_features, bias=old.bias is not None, device="meta")
    head.weight = old.weight
    if old.bias is not None:
        head.bias = old.bias
    model.set_output_embeddings(head)
    return head


def response_rows(prompt_lens: list[int], resp_lens: list[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat indices into the `[B * seq_len]` hidden rows that predict a response token, and the
    matching flat indices into the `[B * seq_len]` input ids: the targets). Response token j of
    sample b sits at `prompt_len + j` and is predicted by position `prompt_len + j - 1`. Pad
    positions and prompt positions are left out, so the vocabulary work is per real token."""
    src, tgt = [], []
    for b, (p, r) in enumerate(zip(prompt_lens, resp_lens)):
        base = b * seq_len
        pos = torch.arange(p - 1, p - 1 + r)
        src.append(base + pos)
        tgt.append(base + pos + 1)
    if not src:
        return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long)
    return torch.cat(src), torch.cat(tgt)


def _chunk(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, t: torch.Tensor, temperature: float,
           want_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.nn.functional.linear(h, w, b).float()
    if temperature != 1.0:
        logits = logits / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, t[:, None]).squeeze(-1)
    if want_entropy:
        with torch.no_grad():
            ent = -(logp_all.exp() * logp_all).sum(-1)
    else:
        ent = torch.zeros_like(logp).detach()
    return logp, ent


def chunked_log_probs(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, targets: torch.Tensor,
                      *, chunk_tokens: int, temperature: float = 1.0,
                      entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-row log-prob of `targets` under `log_softmax(hidden @ weight.T + bias) / temperature)`
    and (detached) entropy, for `hidden [N, H]`, `targets [N]`; at most `chunk_tokens` rows of
    `[., V]` float32 exist at once. Under autograd each chunk is recomputed in backward
    (`torch.utils.checkpoint`), so only `hidden` is saved. Returns `(logp [N], entropy [N] | None)`."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
    n = hidden.shape[0]
    if n == 0:
        z = hidden.new_zeros(0, dtype=torch.float32)
        return z, (z if entropy else None)
    grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    outs, ents = [], []
    for a in range(0, n, chunk_tokens):
        h, t = hidden[a:a + chunk_tokens], targets[a:a + chunk_tokens]
        if grad:
            lp, ent = checkpoint(_chunk, h, weight, bias, t, temperature, entropy, use_reentrant=False)
        else:
            lp, ent = _chunk(h, weight, bias, t, temperature, entropy)
        outs.append(lp)
        ents.append(ent)
    return torch.cat(outs), (torch.cat(ents).detach() if entropy else None)
