"""The shared model core: a Llama-style decoder whose positional encoding is one pluggable component.

Parameter names follow the Hugging Face Llama layout (`model.embed_tokens.weight`,
`model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`), so Llama checkpoints
load and export without renaming. PE parameters live under `model.layers.{i}.pe.*`. Each layer is what its
`LayerSpec` says (tapecli.model.schedule: its PE, sliding window, temperature, length scale); a model whose layers
use several PEs carries one positional state per PE (tapecli.model.hybrid).

    logits = model(input_ids, start_pos=0, cache=None, attention_mask=None)          # [B, T, vocab]
    hidden, state = model.run(input_ids, start_pos=0, cache=None, state=None, attention_mask=None)
    out = model.generate(input_ids, max_new_tokens, ..., attention_mask=None, prefill_chunk=None)  # generation.py

`model.train()` turns on `config.dropout` (embeddings and each residual branch, nanoGPT's places); `model.eval()`
turns it off.

`attention_mask` [B, T] (1 = real token, 0 = padding, any layout for scoring; left padding for generation) hides
padding from every query and counts positions over real tokens, so each row's first real token is at `start_pos`
(an int, or [B] per row) and every real token's output equals what its row computes alone; outputs at padded
positions are finite and meaningless. Memory stays linear in T for every PE, with or without padding: attention
(`tapecli.model.attention`) never keeps a [T, T] tensor per head for a long sequence; `tape doctor` prints the path
each PE takes on this machine.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tapecli.model.abacus import AbacusEmbedding
from tapecli.model.attention import WideValue, attend
from tapecli.model.attention.gate import output_gate
from tapecli.model.attention.scaling import QueryScale
from tapecli.model.attention.sinks import sink_logits
from tapecli.model.block import BlockLayout
from tapecli.model.cache import KVCache, LayerCache
from tapecli.model.config import ModelConfig
from tapecli.model.generation import generate
from tapecli.model.hybrid import HybridState, layer_groups, model_pe
from tapecli.model.norm import RMSNorm, block_norm, head_norms
from tapecli.model.pe import LayerPE, PositionState
from tapecli.model.schedule import LayerSpec


class MLP(nn.Module):
    """SwiGLU: down(SiLU(gate(x)) * up(x)); GeGLU with GeLU-tanh for `activation` gelu_tanh (model.block)."""

    def __init__(self, dim: int, ffn_dim: int, activation: str = "silu") -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)
        self.tanh_gelu = activation == "gelu_tanh"

    def forward(self, x: Tensor) -> Tensor:
        gate = self.gate_proj(x)
        gate = F.gelu(gate, approximate="tanh") if self.tanh_gelu else F.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, spec: LayerSpec) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.causal = config.causal
        self.window = spec.window
        self.temperature = spec.temperature * BlockLayout.of(config.block).temperature(config.head_dim)
        self.query_scale = QueryScale.of(spec.length_scale, spec.length_scale_args, config.max_seq_len)
        self.q_proj = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)
        self.q_norm, self.k_norm = head_norms(config)  # per-head query/key norms (model.qk_norm), else identities
        self.output_gate = output_gate(config)  # a sigmoid gate on each head's output (model.output_gate), or None
        self.sinks = sink_logits(spec, config.n_heads)  # a learned sink logit per head (model.sinks), or None

    def project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries [B, H, T, d], keys and values [B, H_kv, T, d] of `x` [B, T, dim], before the PE."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        return q, k, v

    def forward(self, x: Tensor, pe: LayerPE, state: PositionState, k_pos: Tensor, key_mask: Tensor | None,
                cache: LayerCache | None, aggregation: str | None) -> tuple[Tensor, Tensor | None]:
        """Returns the attention output and, when `aggregation` is set (TAPE), the attention-weighted average of the
        positional state, computed with the very same attention weights. What attention does beyond q.k is the
        PE's declared need; how it is done is `tapecli.model.attention`'s choice."""
        B, T, _ = x.shape
        q, k, v = self.project(x)
        q, k = pe.rotate(q, k, state)
        if self.query_scale is not None:
            q = self.query_scale(q, state.positions)
        need = pe.need(state, aggregation is not None)
        y = attend(q, k, v, need, x=x, q_pos=state.positions, k_pos=k_pos, key_mask=key_mask, cache=cache,
                   causal=self.causal, window=self.window, temperature=self.temperature, sinks=self.sinks)
        aggregated = None
        if isinstance(need, WideValue):  # the need's columns come back after the value head
            y, aggregated = y[..., :self.head_dim], y[..., self.head_dim:].to(need.values.dtype)
        if self.output_gate is not None:
            y = self.output_gate(y, x)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y), aggregated


class Block(nn.Module):
    """Decoder block, its norms where `model.block` places them (tapecli.model.block; pre-norm by default); the
    positional state (if the PE carries one) is updated beside the hidden state. In a model with several PEs the
    state holds one per PE (`group`): the block reads and updates its own PE's."""

    def __init__(self, config: ModelConfig, spec: LayerSpec, pe: LayerPE, group: int | None, carries_state: bool,
                 aggregation: str | None) -> None:
        super().__init__()
        layout = BlockLayout.of(config.block)
        self.norm_names = layout.norm_names  # slot -> module name, e.g. attn_in: input_layernorm
        mlp = MLP(config.dim, config.ffn_dim, layout.activation)
        # Registered in the order of the computation (parameter order is what optimizer states are saved by).
        for slot, module in (("attn_in", None), ("self_attn", Attention(config, spec)), ("attn_out", None),
                             ("mlp_in", None), ("mlp", mlp), ("mlp_out", None)):
            if module is not None:
                self.add_module(slot, module)
            elif slot in self.norm_names:
                self.add_module(self.norm_names[slot], block_norm(config, config.dim))
        self.parallel = layout.norms == "parallel"  # attention and the MLP both read the one normed input
        self.pe = pe
        self.group = group
        self.dropout = config.dropout  # on each residual branch, in training only
        self.carries_state = carries_state  # update the positional state after attention and the MLP
        self.aggregation = aggregation if carries_state else None

    def forward(self, x: Tensor, state: PositionState | HybridState, k_pos: Tensor, key_mask: Tensor | None = None,
                cache: LayerCache | None = None) -> tuple[Tensor, PositionState | HybridState]:
        own = state if self.group is None else state.parts[self.group]
        attn_in = self.norm("attn_in", x)
        h, aggregated = self.self_attn(attn_in, self.pe, own, k_pos, key_mask, cache, self.aggregation)
        x = x + F.dropout(self.norm("attn_out", h), self.dropout, self.training)
        if aggregated is not None:
            own = self.pe.after_attention(own, aggregated)
        mlp_in = attn_in if self.parallel else self.norm("mlp_in", x)
        mlp_out = self.norm("mlp_out", self.mlp(mlp_in))
        x = x + F.dropout(mlp_out, self.dropout, self.training)
        if self.carries_state:
            own = self.pe.after_mlp(own, mlp_in, mlp_out, x)
            state = own if self.group is None else state.with_part(self.group, own)
        return x, state

    def norm(self, slot: str, x: Tensor) -> Tensor:
        """The norm the layout places at `slot`, or `x` as it is where it places none."""
        name = self.norm_names.get(slot)
        return x if name is None else getattr(self, name)(x)


class Head(nn.Linear):
    """The output projection (`lm_head.weight`), its logits times `model.block.logit_scale` (Cohere) where set."""

    def __init__(self, dim: int, vocab_size: int, scale: float = 1.0) -> None:
        super().__init__(dim, vocab_size, bias=False)
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        logits = super().forward(x)
        return logits if self.scale == 1.0 else logits * self.scale


class Decoder(nn.Module):
    """The `model.*` part of the Hugging Face layout: embeddings, blocks, final norm, and the PE."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        specs = config.layers()
        self.pe = model_pe(config, specs)
        groups = layer_groups(self.pe, config.n_layers)
        self.layers = nn.ModuleList(
            Block(config, spec, self.pe.make_layer(i), group, pe.carries_state, pe.aggregation)
            for i, (spec, (group, pe)) in enumerate(zip(specs, groups, strict=True)))
        for group in dict.fromkeys(group for group, pe in groups if pe.carries_state):
            # The state is dropped after its PE's last layer, so that layer's state updates feed nothing: skip them
            # and freeze their weights (kept, so parameter counts and checkpoints match the official layout).
            last = [layer for layer, (g, _) in zip(self.layers, groups, strict=True) if g == group][-1]
            last.carries_state, last.aggregation = False, None
            last.pe.requires_grad_(False)
        self.norm = block_norm(config, config.dim)
        self.embed_scale = BlockLayout.of(config.block).embed_scale  # embeddings times sqrt(dim) (Gemma)
        self.abacus = AbacusEmbedding(config) if config.abacus else None


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = Head(config.dim, config.vocab_size, BlockLayout.of(config.block).logit_scale)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.gradient_checkpointing = False
        # Parameters that can never receive a gradient (the last layer's TAPE state updates): keep them frozen.
        self.inert_parameters = {name for name, p in self.named_parameters() if not p.requires_grad}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Llama's init: N(0, init_std) for every linear and embedding weight, ones for norms (zeros for (1 + w)
        norms), zeros for the attention's biases (model.qkv_bias), N(0, init_std) for attention sinks (GPT-OSS's);
        then each PE's own."""
        for module in self.modules():
            if isinstance(module, Attention) and module.sinks is not None:
                nn.init.normal_(module.sinks, mean=0.0, std=self.config.init_std)
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            elif isinstance(module, Attention) and self.config.qkv_bias:
                for projection in (module.q_proj, module.k_proj, module.v_proj):
                    nn.init.zeros_(projection.bias)
            elif isinstance(module, RMSNorm):
                module.reset_parameters()
        for module in self.modules():
            if isinstance(module, LayerPE):
                module.init_weights()

    def forward(self, input_ids: Tensor, start_pos: int | Tensor = 0, cache: KVCache | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """Logits [B, T, vocab] of `input_ids` [B, T]; see `run` for positions, cache and attention_mask."""
        hidden, _ = self.run(input_ids, start_pos, cache, attention_mask=attention_mask)
        return self.lm_head(hidden)

    def run(self, input_ids: Tensor, start_pos: int | Tensor = 0, cache: KVCache | None = None,
            state: PositionState | HybridState | None = None,
            attention_mask: Tensor | None = None) -> tuple[Tensor, PositionState | HybridState]:
        """The final-normed hidden states [B, T, dim] and the positional state after the last layer.

        Positions are start_pos + 0..T-1 (start_pos an int, or [B] per row). `attention_mask` [B, T] (1 = real
        token, 0 = padding) hides padding from every query and counts positions over real tokens only, so a row
        computes exactly what it computes alone; outputs at padded positions are finite and meaningless. With a
        `cache`, the tokens continue the cached ones (pass start_pos = the position of their first real token).
        `state` replaces the PE's initial state, e.g. to study how TAPE transforms a rotated state, or to prefill a
        long prompt in chunks with the state of the whole prompt (a HybridState, one part per PE, in a model whose
        layers use several PEs)."""
        B, T = input_ids.shape
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # nothing is padded: keep SDPA's fused causal path
        x = self.model.embed_tokens(input_ids)
        if self.model.embed_scale:
            x = x * torch.tensor(self.config.dim ** 0.5, dtype=x.dtype)
        if self.model.abacus is not None:
            x = x + self.model.abacus(input_ids, cache, attention_mask)
        x = F.dropout(x, self.config.dropout, self.training)
        pe = self.model.pe
        if state is None:
            positions = pe.positions(B, T, start_pos, input_ids.device, attention_mask)
            state = pe.initial_state(positions, self.model.embed_tokens.weight.dtype)
            if cache is not None:
                key = pe.cache_key(positions)
                if len(cache) and key != cache.pe_key:
                    raise ValueError(f"KV cache: the positional encoding changed since the cached keys were encoded "
                                     f"({cache.pe_key} -> {key}, dynamic NTK); recompute the cache "
                                     f"(Transformer.generate does)")
                cache.pe_key = key
        if cache is None:
            k_pos, key_mask = state.positions, None if attention_mask is None else attention_mask.bool()
        else:
            k_pos, key_mask = cache.extend(state.positions, attention_mask, B)
        for i, layer in enumerate(self.model.layers):
            layer_cache = None if cache is None else cache.layers[i]
            if self.gradient_checkpointing and self.training:
                x, state = checkpoint(layer, x, state, k_pos, key_mask, layer_cache, use_reentrant=False)
            else:
                x, state = layer(x, state, k_pos, key_mask, layer_cache)
        return self.model.norm(x), state

    def new_cache(self, capacity: int = 0) -> KVCache:
        """An empty KV cache for this model: room for `capacity` tokens, windowed layers keeping only their window."""
        return KVCache(self.config.n_layers, capacity, windows=[layer.self_attn.window for layer in self.model.layers])

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop_tokens: list[int] | None = None, pad_id: int | None = None, start_pos: int = 0,
                 attention_mask: Tensor | None = None, prefill_chunk: int | None = None,
                 stop_check: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """Prompt + up to max_new_tokens new tokens, [B, T + n]; see `tapecli.model.generation`."""
        return generate(self, input_ids, max_new_tokens, use_cache=use_cache, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, stop_tokens=stop_tokens, pad_id=pad_id, start_pos=start_pos,
                        attention_mask=attention_mask, prefill_chunk=prefill_chunk, stop_check=stop_check)


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Unique parameters (tied weights counted once): total, trainable, and those that belong to the PE."""
    total = trainable = pe = 0
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
        pe += p.numel() if ".pe." in f".{name}" else 0
    return {"total": total, "trainable": trainable, "pe": pe}
