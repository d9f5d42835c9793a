"""Token log-probs and entropy from a causal LM without the full `[B, L, V]` float32 logits.

Owns: `token_log_probs` (the response tokens' log-probs, mask and entropy of a batch's rows under
a model: full logits, or chunked when `logprob_chunk_tokens > 0`), `HiddenStateHead` (the LM head module that hands the final hidden states through, so one
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

import warnings

import torch
from torch.utils.checkpoint import checkpoint

from pivotrl.trainer.train_batch import TrainBatch

__all__ = ["HiddenStateHead", "chunked_log_probs", "response_rows", "install_hidden_head", "padded_rows",
           "token_log_probs"]


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


def token_log_probs(model: torch.nn.Module, batch: TrainBatch, idx: list[int], device: torch.device, *,
                    temperature: float, chunk_tokens: int, entropy: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs `[B, R]` of each response token of rows `idx` under `model` (at `temperature`),
    the 0/1 mask `[B, R]` and, if asked, the policy's entropy at each response position (detached,
    for monitoring). `chunk_tokens > 0` takes the chunked path (no `[B, L, V]` logits).

    Sequences are right-padded and run without an attention mask: causal attention means pad
    tokens after a sequence never influence its own positions, and positions stay 0..L-1."""
    prompts = [batch.prompt_ids[i] for i in idx]
    resps = [batch.response_ids[i] for i in idx]
    lens = [len(p) + len(r) for p, r in zip(prompts, resps)]
    L, R = max(lens), max(1, max(len(r) for r in resps))
    ids = torch.zeros(len(idx), L, dtype=torch.long)
    pos = torch.zeros(len(idx), R, dtype=torch.long)
    mask = torch.zeros(len(idx), R)
    for b, (p, r) in enumerate(zip(prompts, resps)):
        ids[b, : len(p) + len(r)] = torch.tensor(p + r, dtype=torch.long)
        # Response token j sits at len(p)+j and is predicted by the logits at len(p)+j-1.
        pos[b] = (len(p) - 1 + torch.arange(R)).clamp(max=L - 2 if L > 1 else 0)
        mask[b, : len(r)] = 1.0
    ids, pos, mask = ids.to(device), pos.to(device), mask.to(device)
    if chunk_tokens > 0:
        return _chunked_token_log_probs(model, ids, [len(p) for p in prompts], [len(r) for r in resps], R, mask,
                                        device, temperature=temperature, chunk_tokens=chunk_tokens, entropy=entropy)
    logits = model(input_ids=ids, use_cache=False).logits  # [B, L, V]
    sel = logits.gather(1, pos[..., None].expand(-1, -1, logits.shape[-1]))  # [B, R, V]
    logp_all = torch.log_softmax(sel.float() / temperature, dim=-1)
    targets = ids.gather(1, (pos + 1).clamp(max=L - 1))
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    ent = None
    if entropy:
        with torch.no_grad():
            ent = -(logp_all.exp() * logp_all).sum(-1) * mask
    return logp * mask, mask, ent


def _chunked_token_log_probs(model: torch.nn.Module, ids: torch.Tensor, plens: list[int], rlens: list[int], R: int,
                             mask: torch.Tensor, device: torch.device, *, temperature: float, chunk_tokens: int,
                             entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`token_log_probs` without `[B, L, V]` logits: the model returns its final hidden states
    (`HiddenStateHead`), the response rows are picked out (pad and prompt positions dropped) and
    `chunked_log_probs` runs the head and log-softmax `chunk_tokens` rows at a time. Same values
    as the full-logits path up to float rounding."""
    head = model.get_output_embeddings()
    if not isinstance(head, HiddenStateHead):
        raise RuntimeError("chunked log-probs need the HiddenStateHead installed at build time")
    head.pass_hidden = True
    try:
        with warnings.catch_warnings():
            # The root returns a view (HF slices the hidden states before the head); nothing
            # below modifies it in place, which is what FSDP2's warning is about.
            warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
            hidden = model(input_ids=ids, use_cache=False).logits  # [B, L, H]: the head passed it through
        weight, bias = head.live_weight, head.live_bias
    finally:
        head.pass_hidden = False
        head.release()
    B, L, H = hidden.shape
    src, tgt = response_rows(plens, rlens, L)
    src, tgt = src.to(device), tgt.to(device)
    logp_flat, ent_flat = chunked_log_probs(
        hidden.reshape(B * L, H)[src], weight, bias, ids.reshape(-1)[tgt],
        chunk_tokens=chunk_tokens, temperature=temperature, entropy=entropy)
    dst = torch.cat([b * R + torch.arange(r) for b, r in enumerate(rlens)]).to(device)
    logp = torch.zeros(B * R, device=device).index_put((dst,), logp_flat).view(B, R)
    ent = None
    if entropy:
        ent = torch.zeros(B * R, device=device).index_put((dst,), ent_flat).view(B, R)
    return logp, mask, ent


def padded_rows(rows: list[list[float]], R: int, device: torch.device) -> torch.Tensor:
    """Per-token values of each row, right-padded with zeros to `[len(rows), R]`, on `device`."""
    out = torch.zeros(len(rows), R)
    for b, r in enumerate(rows):
        out[b, : len(r)] = torch.tensor(r, dtype=torch.float32)
    return out.to(device)
