"""The CPU engine's running batch: one shared KV cache, batched prefill and decode, and sampling.

Owns: `CPUSeq` (a sequence inside the engine: request, tokens and log-probs so far, stop ids, own
generator), `KVBatch` (the running rows and their cache: prefill, decode, merge, drop rows),
`RowCacheBatch` (the same for models whose cache is not plain attention KV), `batch_class_for`
(which of the two a model needs) and `sample_next` (greedy, temperature, top-p, per-sequence
seeds, with the behaviour log-prob). It knows nothing about admission, timing or weights:
`cpu_engine.py` decides what runs.

Models with recurrent layers (Qwen3.5's gated delta net: a convolution state and a recurrent
state per row instead of keys and values over time) cannot share one left-padded cache: there is
no time axis to pad, and a padded prefill would run the padding through the recurrence.
`RowCacheBatch` gives each row its own cache and runs each row's prefill and decode on its own
(batch size 1, no padding, no mask), which is exact for any architecture transformers runs, at
the cost of batching. It serves the frozen judges that only the CPU engine can run here (vLLM's
CPU build cannot import Qwen3.5).

KV layout (why it is correct). All running sequences share one `DynamicCache` of shape
`(B, kv_heads, T, head_dim)` per layer, left-padded: row `b` holds its real tokens in the last
`len_b` columns, and `valid` marks real columns. The attention mask is built here as a 4D
boolean mask (causal and key-is-real), and every row gets its own `position_ids` (its real
position), so padding changes neither the attention nor RoPE. Sequences join between iterations:
new ones are prefilled as a batch (left-padded among themselves) and their caches are concatenated
with the running batch after padding both on the left to a common length. Sequences leave between
iterations: their rows are dropped, and padding columns no row needs any more are trimmed. Padding
keys/values are zeroed so they never carry NaN into a masked product.

Rows that are the same tokens (a GRPO group's shared prompt; a judge prompt whose response another
row also got) are prefilled once per batch and the cache rows, mask and logits copied to each, up
to float rounding what each would have got from its own row, for a fraction of the compute (in a
6-step run of the embedded default, 37-58 % of a device's prefill tokens were unique). Each row
then samples on its own.

Per sequence, the cache holds the prompt and all generated tokens except the last one (the
"pending" token), which the next decode iteration feeds.

Behaviour log-probs (protocol docstring): with each sampled token `sample_next` returns
`log_softmax(logits / T)` at that token (T = the request's temperature, 1 for greedy), computed
in float32 from the same logits it sampled from, before top-p truncation.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from pivotrl.engines.protocol import GenerationRequest, TokensSoFar


@dataclass
class CPUSeq:
    """One sequence inside the CPU engine, waiting or running."""

    req: GenerationRequest
    generated: list[int]
    version: int
    stops: frozenset[int]
    gen: torch.Generator | None
    reprefill: int = 0
    logprobs: list[float] | None = None  # behaviour log-prob per generated token; None = unknown
    reported: int = 0  # tokens of `generated` already reported by `new_tokens` (or given at submit)

    def so_far(self) -> TokensSoFar:
        return TokensSoFar(self.generated, self.logprobs)

    @property
    def total(self) -> int:
        return len(self.req.prompt_ids) + len(self.generated)


class KVBatch:
    """Running rows: `seqs[b]` owns row b of every cache tensor and of `valid`."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.seqs: list[CPUSeq] = []
        self.cache: Any = None  # transformers DynamicCache, or None when empty
        self.valid: torch.Tensor | None = None  # (B, T) bool: real (non-padding) cache columns

    def kv_tokens(self) -> int:
        return sum(s.total for s in self.seqs)

    @staticmethod
    def prefill(model: torch.nn.Module, seqs: list[CPUSeq]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Prefill `seqs` as one batch, left-padded among themselves: their cache, its `valid`
        mask and each row's last-position logits (not yet part of the running batch: `merge`)."""
        from transformers import DynamicCache

        # Identical rows (a GRPO group's prompt, a judge prompt of two equal responses) are run once
        # and their cache, mask and logits copied to each of them (module docstring).
        first: dict[tuple[int, ...], int] = {}
        of_row = [first.setdefault(tuple(s.req.prompt_ids + s.generated), len(first)) for s in seqs]
        rows = list(first)
        T = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), T, dtype=torch.long)
        valid = torch.zeros(len(rows), T, dtype=torch.bool)
        for b, r in enumerate(rows):
            ids[b, T - len(r):] = torch.tensor(r, dtype=torch.long)
            valid[b, T - len(r):] = True
        pos = (valid.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        eye = torch.eye(T, dtype=torch.bool)
        # Padding queries attend to themselves only, so no softmax row is empty (no NaN).
        mask = (causal[None] & valid[:, None, :]) | (eye[None] & ~valid[:, :, None])
        cache = DynamicCache(config=model.config)
        with torch.no_grad():
            # a 4D mask is used as given by every family (GLM-4 takes no per-layer-type dict)
            out = model(input_ids=ids, attention_mask=mask[:, None], position_ids=pos,
                        past_key_values=cache, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1, :]
        for layer in cache.layers:
            layer.keys.masked_fill_(~valid[:, None, :, None], 0.0)
            layer.values.masked_fill_(~valid[:, None, :, None], 0.0)
        if len(rows) < len(seqs):
            idx = torch.tensor(of_row, dtype=torch.long)
            for layer in cache.layers:
                layer.keys, layer.values = layer.keys.index_select(0, idx), layer.values.index_select(0, idx)
            valid, logits = valid.index_select(0, idx), logits.index_select(0, idx)
        return cache, valid, logits

    def decode(self, model: torch.nn.Module) -> torch.Tensor:
        """One decode iteration of every running row (feeding its pending token); the logits."""
        n = len(self.seqs)
        ids = torch.tensor([[s.generated[-1]] for s in self.seqs], dtype=torch.long)
        pos = torch.tensor([[s.total - 1] for s in self.seqs], dtype=torch.long)
        valid = torch.cat([self.valid, torch.ones(n, 1, dtype=torch.bool)], dim=1)
        with torch.no_grad():
            out = model(input_ids=ids, attention_mask=valid[:, None, None, :],
                        position_ids=pos, past_key_values=self.cache, use_cache=True)
        self.cache, self.valid = out.past_key_values, valid
        return out.logits[:, -1, :]

    def merge(self, seqs: list[CPUSeq], cache: Any, valid: torch.Tensor) -> None:
        """Append prefilled rows to the running batch (prefill rows are the last rows, in order)."""
        if not self.seqs:
            self.seqs, self.cache, self.valid = list(seqs), cache, valid
            return
        T = max(self.valid.shape[1], valid.shape[1])
        pad = lambda x, dim: torch.nn.functional.pad(x, (0, 0) * (x.dim() - dim - 1) + (T - x.shape[dim], 0))  # noqa: E731
        for old, new in zip(self.cache.layers, cache.layers):
            old.keys = torch.cat([pad(old.keys, 2), pad(new.keys, 2)], dim=0)
            old.values = torch.cat([pad(old.values, 2), pad(new.values, 2)], dim=0)
        self.valid = torch.cat([pad(self.valid, 1), pad(valid, 1)], dim=0)
        self.seqs = self.seqs + list(seqs)

    def keep_rows(self, keep: list[int]) -> None:
        """Keep only rows `keep` (in that order) and trim padding columns no row needs."""
        if not keep:
            self.clear()
            return
        idx = torch.tensor(keep, dtype=torch.long)
        valid = self.valid.index_select(0, idx)
        # Drop leading columns that are padding in every remaining row.
        first = int(valid.any(dim=0).long().argmax())
        for layer in self.cache.layers:
            layer.keys = layer.keys.index_select(0, idx)[:, :, first:]
            layer.values = layer.values.index_select(0, idx)[:, :, first:]
        self.valid = valid[:, first:]
        self.seqs = [self.seqs[i] for i in keep]


class RowCacheBatch:
    """Running rows, each with its own cache (module docstring); `KVBatch`'s interface."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.seqs: list[CPUSeq] = []
        self.cache: list[Any] = []  # one transformers cache per row

    def kv_tokens(self) -> int:
        return sum(s.total for s in self.seqs)

    @staticmethod
    def prefill(model: torch.nn.Module, seqs: list[CPUSeq]) -> tuple[list[Any], None, torch.Tensor]:
        """Each of `seqs` prefilled alone: their caches, no mask, and each row's last logits."""
        from transformers import DynamicCache

        caches, logits = [], []
        with torch.no_grad():
            for s in seqs:
                ids = torch.tensor([s.req.prompt_ids + s.generated], dtype=torch.long)
                out = model(input_ids=ids, past_key_values=DynamicCache(config=model.config), use_cache=True,
                            logits_to_keep=1)
                caches.append(out.past_key_values)
                logits.append(out.logits[:, -1, :])
        return caches, None, torch.cat(logits, dim=0)

    def decode(self, model: torch.nn.Module) -> torch.Tensor:
        """One decode iteration of every running row, each on its own cache; the logits."""
        logits = []
        with torch.no_grad():
            for b, s in enumerate(self.seqs):
                out = model(input_ids=torch.tensor([[s.generated[-1]]], dtype=torch.long),
                            position_ids=torch.tensor([[s.total - 1]], dtype=torch.long),
                            past_key_values=self.cache[b], use_cache=True)
                self.cache[b] = out.past_key_values
                logits.append(out.logits[:, -1, :])
        return torch.cat(logits, dim=0)

    def merge(self, seqs: list[CPUSeq], cache: list[Any], valid: None) -> None:
        del valid
        self.seqs = self.seqs + list(seqs)
        self.cache = self.cache + list(cache)

    def keep_rows(self, keep: list[int]) -> None:
        self.seqs = [self.seqs[i] for i in keep]
        self.cache = [self.cache[i] for i in keep]


def batch_class_for(config: Any) -> type:
    """`KVBatch` for a model whose cache is attention keys and values in every layer, else
    `RowCacheBatch` (module docstring)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = DynamicCache(config=config).layers
    return KVBatch if all(type(layer) is DynamicLayer for layer in layers) else RowCacheBatch


def sample_next(logits: torch.Tensor, seqs: list[CPUSeq], shared_gen: torch.Generator) -> tuple[list[int], list[float]]:
    """Next token per row: argmax for greedy rows, temperature + top-p sampling otherwise (a row's
    own generator if its request has a seed, else `shared_gen`); and its behaviour log-prob
    `log_softmax(logits / T)[token]` (T = 1 for greedy rows)."""
    logits = logits.float()
    out = logits.argmax(dim=-1)
    # Greedy rows report the model's own (T = 1) distribution: see the protocol docstring.
    lp_temps = torch.tensor([s.req.params.temperature if not s.req.params.greedy else 1.0
                             for s in seqs])[:, None]
    rows = [b for b, s in enumerate(seqs) if not s.req.params.greedy]
    if rows:
        idx = torch.tensor(rows, dtype=torch.long)
        temps = torch.tensor([seqs[b].req.params.temperature for b in rows])[:, None]
        top_p = torch.tensor([seqs[b].req.params.top_p for b in rows])[:, None]
        probs = torch.softmax(logits.index_select(0, idx) / temps, dim=-1)
        sp, si = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = (sp.cumsum(-1) - sp) >= top_p
        sp = sp.masked_fill(drop, 0.0)
        shared = [j for j, b in enumerate(rows) if seqs[b].gen is None]
        if shared:
            j = torch.tensor(shared, dtype=torch.long)
            pick = torch.multinomial(sp.index_select(0, j), 1, generator=shared_gen)[:, 0]
            for jj, p in zip(shared, pick.tolist()):
                out[rows[jj]] = si[jj, p]
        for j, b in enumerate(rows):
            if seqs[b].gen is not None:
                p = int(torch.multinomial(sp[j], 1, generator=seqs[b].gen))
                out[b] = si[j, p]
    logp = torch.log_softmax(logits / lp_temps, dim=-1).gather(1, out[:, None])[:, 0]
    return [int(t) for t in out.tolist()], [float(x) for x in logp.tolist()]
