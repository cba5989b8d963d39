"""The shared model core: a Llama-style decoder whose positional encoding is one pluggable component.

Parameter names follow the Hugging Face Llama layout (`model.embed_tokens.weight`,
`model.layers.{i}.self_attn.q_proj.weight`, ..., `model.norm.weight`, `lm_head.weight`), so Llama checkpoints
load and export without renaming. PE parameters live under `model.layers.{i}.pe.*`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tapecli.model.abacus import AbacusEmbedding
from tapecli.model.config import ModelConfig
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
        # Normalise in fp32 like Llama, then return to the input dtype.
        h = x.float()
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


def attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool,
           scale: float | None = None) -> Tensor:
    """softmax(q k^T * scale + mask) v over [B, H, T, d] tensors (scale defaults to 1/sqrt(d)); flash-attn on GPU
    when it is installed and usable."""
    if (flash_attn_func is not None and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and mask is None
            and v.shape[-1] == q.shape[-1]):
        # flash-attn aligns the causal mask bottom-right, which is what a KV cache needs.
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=is_causal,
                              softmax_scale=scale)
        return out.transpose(1, 2)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=k.shape[1] != q.shape[1])


def attention_mask(bias: Tensor | None, q_len: int, k_len: int, dtype: torch.dtype, device: torch.device,
                   causal: bool = True) -> tuple[Tensor | None, bool]:
    """The causal mask (queries are the last q_len of k_len tokens) combined with an optional logit bias.

    Returns (mask, is_causal): without bias and cache the mask stays implicit so SDPA can pick its fused kernels.
    """
    if not causal:
        return (None if bias is None else bias.to(dtype)), False
    past = k_len - q_len
    if bias is None:
        if q_len == 1:
            return None, False  # one new token may see everything before it
        if past == 0:
            return None, True
    allowed = torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(past)
    if bias is None:
        return allowed, False
    return bias.to(dtype).masked_fill(~allowed, float("-inf")), False


class KVCache:
    """Keys and values (already position-encoded) of past tokens, per layer; for TAPE also each layer's positional
    state of past tokens, which causal attention never changes. Holds the past positions for bias PEs."""

    def __init__(self, n_layers: int) -> None:
        self.layers: list[dict[str, Tensor]] = [{} for _ in range(n_layers)]
        self.positions: Tensor | None = None
        self.abacus_run: Tensor | None = None  # length of the digit run at the last cached token

    def __len__(self) -> int:
        return 0 if self.positions is None else self.positions.shape[-1]

    def extend_positions(self, positions: Tensor) -> Tensor:
        if self.positions is not None:
            past = self.positions.expand(positions.shape[0], -1)
            positions = torch.cat((past, positions.expand(past.shape[0], -1)), dim=-1)
        self.positions = positions
        return positions


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = config.n_heads, config.n_kv_heads, config.head_dim
        self.causal = config.causal
        self.q_proj = nn.Linear(config.dim, config.n_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.dim, config.n_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_heads * config.head_dim, config.dim, bias=False)

    def forward(self, x: Tensor, pe: LayerPE, state: PositionState, k_pos: Tensor, cache: dict | None,
                aggregation: str | None) -> tuple[Tensor, Tensor | None]:
        """Returns the attention output and, when `aggregation` is set (TAPE), the attention-weighted average of the
        positional state, computed with the very same attention weights."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = pe.rotate(q, k, state)
        E = state.rotary if aggregation else None
        if k.shape[1] != v.shape[1]:  # the PE expanded grouped keys to one per query head
            v = v.repeat_interleave(k.shape[1] // v.shape[1], dim=1)
        if cache is not None:
            if cache:
                k, v = torch.cat((cache["k"], k), dim=2), torch.cat((cache["v"], v), dim=2)
                if E is not None:
                    E = torch.cat((cache["e"].expand(B, -1, -1, -1), E.expand(B, -1, -1, -1)), dim=2)
            cache.update(k=k, v=v, **({"e": E} if E is not None else {}))
        mask, is_causal = attention_mask(pe.bias(state.positions, k_pos), T, k.shape[2], q.dtype, q.device,
                                         self.causal)
        aggregated = None
        if E is None:
            # CoPE and PaTH compute attention themselves (their logits are not q.k plus a bias); others give None.
            y = pe.attend(x, q, k, v, mask, is_causal, cache)
            if y is None:
                y = attend(q, k, v, mask, is_causal)
        elif aggregation == "concat":
            # One attention over [V | E]: the weights are computed once and applied to both. Fused kernels want
            # queries and keys as wide as the values, so they are zero-padded (q.k is unchanged; scale kept).
            values = torch.cat((v, E.to(v.dtype).expand(B, -1, -1, -1)), dim=-1)
            pad = (0, values.shape[-1] - q.shape[-1])
            out = attend(F.pad(q, pad), F.pad(k, pad), values, mask, is_causal, scale=self.head_dim ** -0.5)
            y, aggregated = out.split([v.shape[-1], E.shape[-1]], dim=-1)
        else:
            # Two calls with identical q, k and mask give identical weights: the straightforward reference path.
            y = attend(q, k, v, mask, is_causal)
            aggregated = attend(q, k, E.to(v.dtype).expand(B, -1, -1, -1), mask, is_causal)
        y = y.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)
        return self.o_proj(y), None if aggregated is None else aggregated.to(E.dtype)


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

    def forward(self, x: Tensor, state: PositionState, k_pos: Tensor,
                cache: dict | None = None) -> tuple[Tensor, PositionState]:
        h, aggregated = self.self_attn(self.input_layernorm(x), self.pe, state, k_pos, cache, self.aggregation)
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

    def forward(self, input_ids: Tensor, start_pos: int = 0, cache: KVCache | None = None) -> Tensor:
        """Logits [B, T, vocab] for tokens at positions start_pos + arange(T)."""
        hidden, _ = self.run(input_ids, start_pos, cache)
        return self.lm_head(hidden)

    def run(self, input_ids: Tensor, start_pos: int = 0, cache: KVCache | None = None,
            state: PositionState | None = None) -> tuple[Tensor, PositionState]:
        """The final-normed hidden states [B, T, dim] and the positional state after the last layer.

        `state` replaces the PE's initial state, e.g. to study how TAPE transforms a rotated state."""
        B, T = input_ids.shape
        x = self.model.embed_tokens(input_ids)
        if self.model.abacus is not None:
            x = x + self.model.abacus(input_ids, cache)
        if state is None:
            positions = self.model.pe.positions(B, T, start_pos, input_ids.device)
            state = self.model.pe.initial_state(positions, self.model.embed_tokens.weight.dtype)
        k_pos = state.positions if cache is None else cache.extend_positions(state.positions)
        for i, layer in enumerate(self.model.layers):
            layer_cache = None if cache is None else cache.layers[i]
            if self.gradient_checkpointing and self.training:
                x, state = checkpoint(layer, x, state, k_pos, layer_cache, use_reentrant=False)
            else:
                x, state = layer(x, state, k_pos, layer_cache)
        return self.model.norm(x), state

    @torch.no_grad()
    def generate(self, input_ids: Tensor, max_new_tokens: int, use_cache: bool = True, temperature: float = 0.0,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 stop_tokens: list[int] | None = None, pad_id: int | None = None, start_pos: int = 0) -> Tensor:
        """Prompt + up to max_new_tokens new tokens, [B, T + n]. Greedy when temperature == 0, else sampling with
        a generator seeded by `seed`. A sequence that emitted a stop token is padded with `pad_id` (default: the
        first stop token) until every sequence has stopped. `use_cache=False` recomputes the whole prefix each step
        (the reference the KV cache is tested against)."""
        was_training = self.training
        self.eval()
        generator = None
        if temperature > 0 and seed is not None:
            generator = torch.Generator(device=input_ids.device).manual_seed(seed)
        stop = torch.tensor(stop_tokens or [], dtype=torch.long, device=input_ids.device)
        pad = pad_id if pad_id is not None else (stop_tokens[0] if stop_tokens else 0)
        finished = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        cache = KVCache(self.config.n_layers) if use_cache else None
        tokens, step_input = input_ids, input_ids
        for _ in range(max_new_tokens):
            if cache is not None:
                logits = self(step_input, start_pos=start_pos + len(cache), cache=cache)[:, -1]
            else:
                logits = self(tokens, start_pos=start_pos)[:, -1]
            next_token = sample_next(logits.float(), temperature, top_k, top_p, generator)
            next_token = torch.where(finished, torch.full_like(next_token, pad), next_token)
            finished |= torch.isin(next_token, stop)
            tokens = torch.cat((tokens, next_token[:, None]), dim=1)
            step_input = next_token[:, None]
            if finished.all():
                break
        self.train(was_training)
        return tokens


def sample_next(logits: Tensor, temperature: float, top_k: int | None, top_p: float | None,
                generator: torch.Generator | None) -> Tensor:
    """Greedy argmax, or a draw from softmax(logits / temperature) restricted to the top-k / top-p tokens."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    logits = logits / temperature
    if top_k is not None:
        kth = logits.topk(min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) > top_p  # keep the smallest prefix whose mass reaches top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


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
