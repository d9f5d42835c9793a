"""Model shapes and parallel layouts over Hugging Face state-dict names (pure: stdlib only).

Owns: `TensorSpec`/`ModelSpec` (every tensor's name, shape, dtype and partition `Rule`, built from a
model config without materialising weights; the per-architecture rules live in families.py),
`Layout` (DP x TP x PP, plus EP for MoE experts, optional fused QKV and gate-up), and
`device_shards`, which says which box of which stored tensor each rank holds. Knows nothing about
where bytes live (see placement.py) or how they move (store.py, transports.py).

Partitioning (Megatron/vLLM conventions), as each tensor's `Rule` says:
- column-parallel (`q/k/v/gate/up_proj`, and the q/k/v biases, which must be split with their
  weights for TP to compute the same thing): dim 0 split in TP parts; q/k/v in whole heads; a fused
  on-disk `gate_up_proj` (GLM-4) splits each of its two blocks, so a rank holds [gate_r; up_r];
- row-parallel (`o_proj`, `down_proj`): dim 1 split; their biases are replicated;
- vocab-parallel (`embed_tokens`, `lm_head`): dim 0 split;
- replicated: norms (incl. Qwen3's per-head `q_norm`/`k_norm`), the MoE router (`mlp.gate`) and
  `shared_expert_gate`;
- MoE experts: with `ep > 1` each EP rank holds whole experts `[r*E/ep, (r+1)*E/ep)`; with `ep == 1`
  they are TP-split like a dense MLP;
- PP: layers split into `pp` contiguous stages; embedding on the first stage, final norm and
  `lm_head` on the last (tied embeddings: the embedding on the last stage too);
- fused QKV: rank holds `self_attn.qkv_proj.{weight,bias}` = cat(q_r, k_r, v_r) on dim 0; fused
  gate-up: `mlp.gate_up_proj.weight` = cat(gate_r, up_r) on dim 0 (vLLM names).
Rank order: TP fastest, then PP, then DP (`rank = (dp*pp_size + pp)*tp_size + tp`).

Dtype contract: a `TensorSpec`'s dtype is the dtype GPS stores and every write must match; a spec
imported from a checkpoint takes each tensor's dtype from the safetensors header (hf_io.py), so
GPS keeps the checkpoint's dtype and a trainer publishes in it (`state_dict.to_store`).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pivotrl.gps.families import REP, Geometry, Rule

DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
    "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}

Box = tuple[tuple[int, int], ...]  # (start, stop) per dim


def box_numel(box: Box) -> int:
    n = 1
    for a, b in box:
        n *= b - a
    return n


def full_box(shape: tuple[int, ...]) -> Box:
    return tuple((0, s) for s in shape)


@dataclass(frozen=True)
class TensorSpec:
    """One stored tensor: HF checkpoint name, shape, dtype name (torch name without `torch.`) and
    how TP/EP partition it (replicated unless said otherwise: always correct, if not frugal)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    rule: Rule = REP

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"tensor {self.name}: dtype {self.dtype!r} unknown; allowed: {sorted(DTYPE_BYTES)}")
        if len(self.shape) < 1:
            raise ValueError(f"tensor {self.name}: 0-d tensors are not supported")

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(eq=False)
class ModelSpec:
    """All tensors of one model plus the head geometry the partitioning rules need.

    Compared by identity: a spec is built once per registered model, and layout caches hang off it."""

    tensors: tuple[TensorSpec, ...]
    num_layers: int
    head_dim: int
    num_experts: int = 0
    tie_word_embeddings: bool = False
    family: str = ""
    """Architecture family (families.FAMILIES key) the rules came from; "" for a hand-made spec."""
    _by_name: dict[str, TensorSpec] = field(default_factory=dict, repr=False)
    _shard_cache: dict["Layout", list] = field(default_factory=dict, repr=False)

    def forget_shards(self) -> None:
        """Drop the cached shard lists of every layout (benchmarks time a cold plan with it)."""
        self._shard_cache.clear()

    def __post_init__(self) -> None:
        self._by_name = {t.name: t for t in self.tensors}
        if len(self._by_name) != len(self.tensors):
            raise ValueError("ModelSpec: duplicate tensor names")

    def __getitem__(self, name: str) -> TensorSpec:
        return self._by_name[name]

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tensors]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @classmethod
    def from_config(cls, cfg: Any, dtype: str | None = None, where: str = "model config") -> "ModelSpec":
        """Shapes and partition rules of a supported `ForCausalLM` (families.py) from a
        `transformers` config or a dict of its `config.json` fields; tensors get `dtype`, else the
        config's `torch_dtype`/`dtype`, else bfloat16. No weights are created. Raises
        UnsupportedArchitectureError naming the architecture when it has no rules."""
        from pivotrl.gps.families import expected_tensors

        fam, g, entries = expected_tensors(cfg, where)
        if dtype is None:
            get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
            raw = get("torch_dtype", None) or get("dtype", None) or "bfloat16"
            dtype = str(raw).replace("torch.", "")
        return cls.from_entries(entries, g, fam.name, {n: dtype for n, _, _ in entries})

    @classmethod
    def from_entries(cls, entries: list, geometry: Geometry, family: str, dtypes: dict[str, str]) -> "ModelSpec":
        """A spec from families.py entries `(name, shape, rule)` with one dtype per tensor."""
        tensors = tuple(TensorSpec(n, tuple(s), dtypes[n], r) for n, s, r in entries)
        return cls(tensors, num_layers=geometry.num_layers, head_dim=geometry.head_dim,
                   num_experts=geometry.num_experts, tie_word_embeddings=geometry.tie_word_embeddings, family=family)


@dataclass(frozen=True)
class Layout:
    """How a device group holds a model: `dp*tp*pp` ranks; `ep` ranks share out MoE experts (taken
    from the DP x TP ranks of a stage, so `ep` must divide `dp*tp`)."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    ep: int = 1
    fused_qkv: bool = False
    fused_gate_up: bool = False

    def __post_init__(self) -> None:
        for f in ("dp", "tp", "pp", "ep"):
            if not isinstance(getattr(self, f), int) or getattr(self, f) < 1:
                raise ValueError(f"layout.{f} must be an int >= 1, got {getattr(self, f)!r}")
        if (self.dp * self.tp) % self.ep:
            raise ValueError(f"layout.ep={self.ep} must divide dp*tp={self.dp * self.tp}")

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(dp_rank, pp_rank, tp_rank) of `rank`."""
        return rank // (self.tp * self.pp), (rank // self.tp) % self.pp, rank % self.tp


class Piece(NamedTuple):
    """`dst_box` of a device tensor equals `src_box` of stored tensor `src` (same extents)."""

    src: str
    src_box: Box
    dst_box: Box


class LocalTensor(NamedTuple):
    """One tensor a rank holds: its (possibly fused) name, shape, dtype and where it comes from."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    pieces: tuple[Piece, ...]


_LAYER = re.compile(r"^model\.layers\.(\d+)\.")
def _stage_of_layers(L: int, pp: int) -> list[int]:
    bounds = [s * L // pp for s in range(pp + 1)]
    return [s for s in range(pp) for _ in range(bounds[s], bounds[s + 1])]


def validate_layout(spec: ModelSpec, layout: Layout) -> None:
    """Raise ValueError naming the tensor and dim when `layout` cannot partition `spec`."""
    if layout.pp > max(spec.num_layers, 1):
        raise ValueError(f"layout.pp={layout.pp} exceeds num_hidden_layers={spec.num_layers}")
    if layout.ep > 1:
        if not spec.num_experts:
            raise ValueError(f"layout.ep={layout.ep} but the model has no MoE experts")
        if spec.num_experts % layout.ep:
            raise ValueError(f"layout.ep={layout.ep} does not divide num_experts={spec.num_experts}")
    tp = layout.tp
    for t in spec.tensors:
        r = t.rule
        if r.kind == "rep" or tp == 1 or (layout.ep > 1 and r.expert >= 0):
            continue
        if t.shape[r.dim] % (r.unit * r.blocks * tp):
            what = f" = {t.shape[r.dim] // r.unit} heads of {r.unit}" if r.unit > 1 else ""
            what += f" in {r.blocks} blocks" if r.blocks > 1 else ""
            raise ValueError(f"layout tp={tp} does not divide dim {r.dim} of {t.name} "
                             f"(size {t.shape[r.dim]}{what})")


def device_shards(spec: ModelSpec, layout: Layout) -> list[tuple[LocalTensor, ...]]:
    """For each rank of `layout`, the tensors it holds. DP replicas share the same tuple, and the
    result is cached on the spec, so a 72B-shaped plan builds each (pp, tp) shard once."""
    hit = spec._shard_cache.get(layout)
    if hit is not None:
        return hit
    validate_layout(spec, layout)
    per_coord: dict[tuple[int, int, int], tuple[LocalTensor, ...]] = {}
    out = []
    for rank in range(layout.world_size):
        d, s, r = layout.coords(rank)
        e = (d * layout.tp + r) % layout.ep
        key = (s, r, e)
        if key not in per_coord:
            per_coord[key] = _rank_tensors(spec, layout, s, r, e)
        out.append(per_coord[key])
    spec._shard_cache[layout] = out
    return out


def _rank_tensors(spec: ModelSpec, layout: Layout, stage: int, tp_rank: int, ep_rank: int) -> tuple[LocalTensor, ...]:
    stage_of = _stage_of_layers(spec.num_layers, layout.pp)
    last = layout.pp - 1
    per_ep = spec.num_experts // layout.ep if layout.ep > 1 else 0
    result: list[LocalTensor] = []
    fused: dict[str, list[Piece]] = {}  # fused name -> pieces, filled in q,k,v / gate,up order
    fused_meta: dict[str, tuple[int, str, list[int]]] = {}
    for t in spec.tensors:
        m = _LAYER.match(t.name)
        if m:
            if stage_of[int(m.group(1))] != stage:
                continue
        elif t.name.startswith("model.embed_tokens"):
            if not (stage == 0 or (spec.tie_word_embeddings and stage == last)):
                continue
        elif stage != last:
            continue
        rule = t.rule
        kind = rule.kind
        if rule.expert >= 0 and per_ep:
            if rule.expert // per_ep != ep_rank:
                continue
            kind = "rep"
        pieces_of_t = _pieces(t, kind, layout.tp, tp_rank)
        local_shape = _local_shape(t, pieces_of_t)
        fname = _fused_name(t.name, layout)
        if fname is None:
            result.append(LocalTensor(t.name, local_shape, t.dtype, pieces_of_t))
            continue
        src_box = pieces_of_t[0].src_box
        if fname not in fused:
            fused[fname] = []
            fused_meta[fname] = (len(result), t.dtype, list(local_shape[1:]))
            result.append(None)  # type: ignore[arg-type]  # placeholder keeps the q/gate position
        pieces = fused[fname]
        off = sum(p.dst_box[0][1] - p.dst_box[0][0] for p in pieces)
        dst = ((off, off + local_shape[0]),) + full_box(local_shape[1:])
        pieces.append(Piece(t.name, src_box, dst))
    for fname, pieces in fused.items():
        pos, dtype, rest = fused_meta[fname]
        rows = sum(p.dst_box[0][1] - p.dst_box[0][0] for p in pieces)
        result[pos] = LocalTensor(fname, (rows, *rest), dtype, tuple(pieces))
    return tuple(result)


def _pieces(t: TensorSpec, kind: str, tp: int, tp_rank: int) -> tuple[Piece, ...]:
    """The rank's slice of `t` as pieces of its local tensor: one piece, or one per block of a
    block-split dim (rank r holds part r of every block, side by side)."""
    if kind == "rep" or tp == 1:
        return (Piece(t.name, full_box(t.shape), full_box(t.shape)),)
    d, blocks = t.rule.dim, t.rule.blocks
    block = t.shape[d] // blocks
    step = block // tp
    local = list(t.shape)
    local[d] = step * blocks
    out = []
    for b in range(blocks):
        src, dst = list(full_box(t.shape)), list(full_box(tuple(local)))
        src[d] = (b * block + tp_rank * step, b * block + (tp_rank + 1) * step)
        dst[d] = (b * step, (b + 1) * step)
        out.append(Piece(t.name, tuple(src), tuple(dst)))
    return tuple(out)


def _local_shape(t: TensorSpec, pieces: tuple[Piece, ...]) -> tuple[int, ...]:
    return tuple(max(p.dst_box[i][1] for p in pieces) for i in range(len(t.shape)))


def _fused_name(name: str, layout: Layout) -> str | None:
    if layout.fused_qkv:
        for x in ("q_proj", "k_proj", "v_proj"):
            if f"self_attn.{x}." in name:
                return name.replace(f"self_attn.{x}.", "self_attn.qkv_proj.")
    if layout.fused_gate_up:
        for x in ("gate_proj", "up_proj"):
            if f".{x}.weight" in name:
                return name.replace(f".{x}.", ".gate_up_proj.")
    return None


def allowed_tp(spec: ModelSpec, max_tp: int = 64) -> list[int]:
    """Every TP degree up to `max_tp` that partitions `spec` (each split dim divisible in whole units)."""
    out = []
    for tp in range(1, max_tp + 1):
        try:
            validate_layout(spec, Layout(tp=tp))
        except ValueError:
            continue
        out.append(tp)
    return out


def check_tp(spec: ModelSpec, tp: int, where: str = "models.policy.tp") -> None:
    """Raise ValueError naming `where`, the tensor that does not split and the TP degrees that do."""
    try:
        validate_layout(spec, Layout(tp=tp))
    except ValueError as e:
        raise ValueError(f"{where}={tp}: {e}; allowed for this model: {allowed_tp(spec)}") from None
