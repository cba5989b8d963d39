"""ModelConfig: every architectural choice of a tape model, JSON-serialisable so checkpoints are self-describing."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

# The keys that shape attention beyond the PE (their defaults: what every model was before they existed).
ATTENTION_KEYS = ("window", "temperature", "length_scale", "length_scale_args", "schedule", "qk_norm", "qkv_bias",
                  "output_gate", "block", "sinks")


@dataclass
class ModelConfig:
    """A Llama-style decoder: pre-norm RMSNorm, SwiGLU MLP, (grouped-query) attention, a positional encoding.

    `pe` picks the positional encoding: a built-in name (`tapecli.model.PE_NAMES`), an installed plugin's name or
    `FILE.py:CLASS` / `MODULE:CLASS` (`tapecli.model.pe.registry.resolve_pe`, the one place that resolves it);
    `pe_args` are its hyperparameters (each PE documents its own, e.g. `theta` and `scaling` for rope).
    `pe_plugin` is not set by users: it records where a plugin PE's code came from (name, package and version, or
    file and content hash), None for a built-in; it is filled in here and saved with the configuration, so a
    checkpoint names what to install. `max_seq_len` is the training context: RoPE scalings use it as the
    original length, and nothing stops a model from running longer sequences.
    `window` (keys each query sees, itself included; None: all), `temperature` (softmax(logits / T)) and
    `length_scale` (+ `length_scale_args`: a query scale by position, tapecli.model.attention.scaling) shape every
    layer's attention; `schedule` changes any of these per layer (tapecli.model.schedule). Their defaults are what
    a model without these keys always was, so older configs mean what they meant. `qk_norm` (Qwen3's per-head
    RMSNorm of queries and keys before the PE, tapecli.model.norm) and `qkv_bias` (biases on the query, key and
    value projections, as Qwen2) add weights to every layer, as does `output_gate` (elementwise | headwise: a
    sigmoid gate on each head's attention output, tapecli.model.attention.gate; none, the default: no gate).
    `block` places the block's norms and says what the q/k norm spans (tapecli.model.block; {} is the Llama
    block). `sinks` gives every layer (a schedule: each kind that sets it) a learned sink logit per head in its
    softmax's denominator (GPT-OSS's attention sinks, tapecli.model.attention.sinks).
    """

    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int | None = None  # None = n_heads (plain multi-head attention)
    head_dim: int | None = None  # None = dim / n_heads; imported models may set it explicitly (HF `head_dim`)
    ffn_dim: int | None = None  # None = 8/3 * dim rounded up to a multiple of 64 (Llama's rule)
    max_seq_len: int = 2048
    pe: str = "rope"
    pe_args: dict[str, Any] = field(default_factory=dict)
    norm_eps: float = 1e-5
    tie_embeddings: bool = False
    init_std: float = 0.02
    dropout: float = 0.0  # training only: dropout on the embeddings and on each residual branch (nanoGPT's places)
    causal: bool = True  # False only for analysis (e.g. permutation-equivariance checks); no KV cache then
    # Abacus digit embedding (McLeish et al. 2024): a learned embedding of each digit's place inside its number.
    abacus: bool = False
    abacus_digit_ids: list[int] = field(default_factory=list)  # token ids of the digits 0-9
    abacus_max_offset: int = 100  # random offset added to digit places during training
    pe_plugin: dict[str, Any] | None = None  # where a plugin PE came from (filled in; see the docstring)
    window: int | None = None  # sliding window: keys each query sees, itself included (None: every earlier key)
    temperature: float = 1.0  # attention temperature: softmax(logits / temperature), positional terms included
    length_scale: str = "none"  # none | llama4 | log: queries scaled by a function of their position
    length_scale_args: dict[str, Any] = field(default_factory=dict)
    schedule: dict[str, Any] = field(default_factory=dict)  # per-layer PE / window / temperature / length scale
    qk_norm: bool = False  # RMSNorm of each head's query and key before the PE (Qwen3)
    qkv_bias: bool = False  # biases on the query, key and value projections (Qwen2)
    output_gate: str = "none"  # none | elementwise | headwise: a sigmoid gate on each head's attention output
    block: dict[str, Any] = field(default_factory=dict)  # norm placement and q/k norm span (tapecli.model.block)
    sinks: bool = False  # a learned sink logit per head in each softmax's denominator (attention sinks)

    def __post_init__(self) -> None:
        from tapecli.model.attention.gate import check_output_gate
        from tapecli.model.block import BlockLayout
        from tapecli.model.pe import resolve_pe
        from tapecli.model.schedule import layer_specs, record_resolved_args

        for key in ("vocab_size", "dim", "n_layers", "n_heads", "max_seq_len"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"model.{key}: expected a positive integer, got {value!r}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if self.dim % self.n_heads:
                raise ValueError(f"model.dim: {self.dim} is not divisible by model.n_heads={self.n_heads}")
            self.head_dim = self.dim // self.n_heads
        if not isinstance(self.head_dim, int) or self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"model.head_dim: {self.head_dim!r} must be a positive even integer (rotary pairs)")
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ValueError(f"model.n_kv_heads: {self.n_kv_heads} must divide model.n_heads={self.n_heads}")
        if self.ffn_dim is None:
            self.ffn_dim = 64 * math.ceil(8 * self.dim / 3 / 64)
        if not isinstance(self.ffn_dim, int) or self.ffn_dim <= 0:
            raise ValueError(f"model.ffn_dim: expected a positive integer, got {self.ffn_dim!r}")
        for key in ("norm_eps", "init_std"):
            if not getattr(self, key) > 0:
                raise ValueError(f"model.{key}: must be > 0, got {getattr(self, key)!r}")
        check_output_gate(self.output_gate)
        if not 0 <= self.dropout < 1:
            raise ValueError(f"model.dropout: must be in [0, 1), got {self.dropout!r}")
        self.pe_args = dict(self.pe_args)
        BlockLayout.of(self.block)
        self.block = dict(self.block)
        self.pe_plugin = resolve_pe(self.pe, self.pe_plugin).record
        # Validates pe_args and the layer keys now (names, types, choices), not at the first forward; then records
        # the defaults the PEs resolved (CoPE's npos_max), so that what is saved keeps its meaning when a later
        # version changes a default.
        record_resolved_args(self, layer_specs(self))
        if self.abacus and len(set(self.abacus_digit_ids)) != 10:
            raise ValueError("model.abacus: needs model.abacus_digit_ids (the 10 distinct digit token ids of the "
                             "tokenizer)")

    def layers(self):
        """Every layer's `LayerSpec` (PE, window, temperature, length scale), tapecli.model.schedule."""
        from tapecli.model.schedule import layer_specs

        return layer_specs(self)

    def attention_keys(self) -> dict[str, Any]:
        """The attention keys (ATTENTION_KEYS) that differ from their defaults: {} for a model that could have been
        written before they existed."""
        defaults = {f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                    for f in dataclasses.fields(self) if f.name in ATTENTION_KEYS}
        return {key: getattr(self, key) for key in ATTENTION_KEYS if getattr(self, key) != defaults[key]}

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if data["pe_plugin"] is None:
            del data["pe_plugin"]  # built-in PEs: the configuration reads as it always has
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"model: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(known))}")
        return cls(**data)
