"""The shared model core: a Llama-style decoder whose positional encoding is one pluggable component.

Parameter names follow the Hugging Face Llama layout (`model.embed_tokens.weight`,
`model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`), so Llama checkpoints
load and export without renaming. PE parameters live under `model.layers.{i}.pe.*`.

    logits = model(input_ids, start_pos=0, cache=None, attention_mask=None)          # [B, T, vocab]
    hidden, state = model.run(input_ids, start_pos=0, cache=None, state=None, attention_mask=None)
    out = model.generate(input_ids, max_new_tokens, ..., attention_mask=None, prefill_chunk=None)  # generation.py

`attention_mask` [B, T] (1 = real token, 0 = padding, any layout for scoring; left padding for generation) hides
padding from every query and counts positions over real tokens, so each row's first real token is at `start_pos`
(an int, or [B] per row) and every real token's output equals what its row computes alone; outputs at padded
positions are finite and meaningless. Memory: without padding, bias and cache, attention stays implicit-causal and
SDPA's fused kernel keeps it linear in T; padding costs a [B, 1, T, T] mask (SDPA turns it into floats) and a bias
PE (ALiBi, T5, FIRE) a [B, H, T, T] float bias per layer (FIRE's MLP briefly [B, T, T, hidden]): both become
[chunk, T] with a KV cache and chunked prefill (`generate(..., prefill_chunk=N)`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tapecli.model.abacus import AbacusEmbedding
from tapecli.model.cache import KVCache, LayerCache
from tapecli.model.config import ModelConfig
from tapecli.model.generation import generate
from tapecli.model.pe import LayerPE, PositionState, build_pe

try:  # optional GPU kernel; a broken build can raise more than ImportError
    from flash_attn import flash_attn_func
except Exception:  # noqa: BLE001
    flash_attn_func = None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # Normalise in fp32 like Llama (fp64 stays fp64), then return to the input dtype.
        h = x.to(torch.promote_types(x.dtype, torch.float32))
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class MLP(nn.Module):
    """SwiGLU: down(SiLU(gate(x)) * up(x))."""

    def __init__(self, dim: int, ffn_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.up_proj = nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool) -> Tensor:
    """softmax(q k^T / sqrt(d_qk) + mask) v over [B, H, T, d] tensors; flash-attn on GPU when it is installed and
    usable. Values may be wider than queries and keys (TAPE's [V | E]): fused kernels want equal widths, so for more
    than one query q and k are zero-padded (q.k unchanged, memory stays linear); a single query (a decoding step)
    computes its [1 x L] weights directly, reading the cached keys once instead of copying them padded."""
    scale = q.shape[-1] ** -0.5
    if v.shape[-1] != q.shape[-1] and q.shape[2] == 1:
        scores = (q * scale) @ k.transpose(-1, -2)  # [B, H, 1, L]: cheap, and the keys are read once
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        return scores.softmax(-1).to(v.dtype) @ v
    if v.shape[-1] != q.shape[-1]:
        pad = (0, v.shape[-1] - q.shape[-1])
        q, k = F.pad(q, pad), F.pad(k, pad)
    if (flash_attn_func is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and mask is None
            and v.shape[-1] == q.shape[-1]):
        # flash-attn aligns the causal mask bottom-right, which is what a KV cache needs.
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=is_causal,
                              softmax_scale=scale)
        return out.transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def attention_mask(bias: Tensor | None, key_mask: Tensor | None, q_len: int, k_len: int, dtype: torch.dtype,
                   device: torch.device, causal: bool = True) -> tuple[Tensor | None, bool]:
    """The causal mask (queries are the last q_len of k_len tokens), minus padded keys (`key_mask` [B, k_len],
    False for padding; a padded query still sees itself, so its row stays finite), plus an optional logit bias.

    Returns (mask, is_causal): without bias, padding and cache the mask stays implicit so SDPA picks its fused
    kernels; otherwise it is [B or 1, 1 or H, q_len, k_len], which chunked prefill keeps linear in k_len.
    """
    past = k_len - q_len
    if bias is None and key_mask is None and causal:
        if q_len == 1:
            return None, False  # one new token may see everything before it
        if past == 0:
            return None, True
    if bias is None and key_mask is None:
        return None, False  # not causal: everything sees everything
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device)
    if causal:
        allowed = allowed.tril(past)
    if key_mask is not None:
        itself = torch.arange(k_len, device=device) == torch.arange(past, k_len, device=device)[:, None]
        allowed = allowed & (key_mask[:, None, :] | itself)  # [B, q_len, k_len]
    allowed = allowed.unsqueeze(-3) if allowed.dim() == 3 else allowed
    if bias is None:
        return allowed, False
    return bias.to(dtype).masked_fill(~allowed, float("-inf")), False


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.causal = config.causal
        self.q_proj = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x: Tensor, pe: LayerPE, state: PositionState, k_pos: Tensor, key_mask: Tensor | None,
                cache: LayerCache | None, aggregation: str | None) -> tuple[Tensor, Tensor | None]:
        """Returns the attention output and, when `aggregation` is set (TAPE), the attention-weighted average of the
        positional state, computed with the very same attention weights."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = pe.rotate(q, k, state)
        if k.shape[1] != v.shape[1]:  # the PE expanded grouped keys to one per query head
            v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)
        d = v.shape[-1]
        if aggregation:  # TAPE: the values are [V | E], so attention averages the state with the same weights
            v = torch.cat((v, state.rotary.to(v.dtype).expand(B, -1, -1, -1)), dim=-1)
        if cache is not None:
            k, v = cache.append(k=k, v=v)
        mask, is_causal = attention_mask(pe.bias(state.positions, k_pos), key_mask, T, k.shape[2], q.dtype,
                                         q.device, self.causal)
        if aggregation == "separate":
            # Two calls with identical q, k and mask give identical weights: the straightforward reference path.
            y = torch.cat([attend(q, k, v[..., :d], mask, is_causal), attend(q, k, v[..., d:], mask, is_causal)], -1)
        else:
            y = attend(q, k, v, mask, is_causal)  # `concat`: the weights are computed once for V and E
        y, aggregated = (y[..., :d], y[..., d:]) if aggregation else (y, None)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y), None if aggregated is None else aggregated.to(state.rotary.dtype)


class Block(nn.Module):
    """Pre-norm decoder block; the positional state (if the PE carries one) is updated beside the hidden state."""

    def __init__(self, config: ModelConfig, pe: LayerPE, carries_state: bool, aggregation: str | None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.dim, config.norm_eps)
        self.mlp = MLP(config.dim, config.ffn_dim)
        self.pe = pe
        self.carries_state = carries_state  # update the positional state after attention and the MLP
        self.aggregation = aggregation if carries_state else None

    def forward(self, x: Tensor, state: PositionState, k_pos: Tensor, key_mask: Tensor | None = None,
                cache: LayerCache | None = None) -> tuple[Tensor, PositionState]:
        h, aggregated = self.self_attn(self.input_layernorm(x), self.pe, state, k_pos, key_mask, cache,
                                       self.aggregation)
        x = x + h
        if aggregated is not None:
            state = self.pe.after_attention(state, aggregated)
        mlp_in = self.post_attention_layernorm(x)
        mlp_out = self.mlp(mlp_in)
        x = x + mlp_out
        if self.carries_state:
            state = self.pe.after_mlp(state, mlp_in, mlp_out, x)
        return x, state


class Decoder(nn.Module):
    """The `model.*` part of the Hugging Face layout: embeddings, blocks, final norm, and the PE."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.dim)
        self.pe = build_pe(config)
        carries, aggregation = self.pe.carries_state, self.pe.aggregation
        self.layers = nn.ModuleList(Block(config, self.pe.make_layer(i), carries, aggregation)
                                    for i in range(config.n_layers))
        if carries:
            # The state is dropped after the last layer, so that layer's state updates feed nothing: skip them and
            # freeze their weights (kept, so parameter counts and checkpoints match the official layout).
            last = self.layers[-1]
            last.carries_state, last.aggregation = False, None
            last.pe.requires_grad_(False)
        self.norm = RMSNorm(config.dim, config.norm_eps)
        self.abacus = AbacusEmbedding(config) if config.abacus else None


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Decoder(config)
        self.lm_head = nn.Linear(config.dim, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.gradient_checkpointing = False
        # Parameters that can never receive a gradient (the last layer's TAPE state updates): keep them frozen.
        self.inert_parameters = {name for name, p in self.named_parameters() if not p.requires_grad}
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Llama's init: N(0, init_std) for every linear and embedding weight, ones for norms; then each PE's own."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=self.config.init_std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        for module in self.modules():
            if isinstance(module, LayerPE):
                module.init_weights()

    def forward(self, input_ids: Tensor, start_pos: int | Tensor = 0, cache: KVCache | None = None,
                attention_mask: Tensor | None = None) -> Tensor:
        """Logits [B, T, vocab] of `input_ids` [B, T]; see `run` for positions, cache and attention_mask."""
        hidden, _ = self.run(input_ids, start_pos, cache, attention_mask=attention_mask)
        return self.lm_head(hidden)

    def run(self, input_ids: Tensor, start_pos: int | Tensor = 0, cache: KVCache | None = None,
            state: PositionState | None = None,
            attention_mask: Tensor | None = None) -> tuple[Tensor, PositionState]:
        """The final-normed hidden states [B, T, dim] and the positional state after the last layer.

        Positions are start_pos + 0..T-1 (start_pos an int, or [B] per row). `attention_mask` [B, T] (1 = real
        token, 0 = padding) hides padding from every query and counts positions over real tokens only, so a row
        computes exactly what it computes alone; outputs at padded positions are finite and meaningless. With a
        `cache`, the tokens continue the cached ones (pass start_pos = the position of their first real token).
        `state` replaces the PE's initial state, e.g. to study how TAPE transforms a rotated state, or to prefill a
        long prompt in chunks with the state of the whole prompt."""
        B, T = input_ids.shape
        if attention_mask is not None and bool(attention_mask.all()):
            attention_mask = None  # nothing is padded: keep SDPA's fused causal path
        x = self.model.embed_tokens(input_ids)
        if self.model.abacus is not None:
            x = x + self.model.abacus(input_ids, cache, attention_mask)
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

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop_tokens: list[int] | None = None, pad_id: int | None = None, start_pos: int = 0,
                 attention_mask: Tensor | None = None, prefill_chunk: int | None = None) -> Tensor:
        """Prompt + up to max_new_tokens new tokens, [B, T + n]; see `tapecli.model.generation`."""
        return generate(self, input_ids, max_new_tokens, use_cache=use_cache, temperature=temperature, top_k=top_k,
                        top_p=top_p, seed=seed, stop_tokens=stop_tokens, pad_id=pad_id, start_pos=start_pos,
                        attention_mask=attention_mask, prefill_chunk=prefill_chunk)


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
