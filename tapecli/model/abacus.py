"""Abacus embeddings (McLeish et al. 2024): each digit token gets a learned embedding of its place inside its
number (1 = first digit written, i.e. the least significant one in reversed arithmetic). During training a random
offset is added to all places of a sequence, so places beyond the training length have been seen at test time."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def digit_places(is_digit: Tensor, carry: Tensor | None = None) -> Tensor:
    """1-based place of each digit within its run of consecutive digits, 0 for other tokens. `carry` [B] continues
    a run from a previous chunk (KV-cached generation)."""
    count = is_digit.long().cumsum(-1)
    count_at_last_break = torch.cummax(torch.where(is_digit, 0, count), dim=-1).values
    places = (count - count_at_last_break) * is_digit
    if carry is not None:
        leading_run = is_digit & ((~is_digit).long().cumsum(-1) == 0)
        places = places + carry[:, None] * leading_run
    return places


class AbacusEmbedding(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        is_digit = torch.zeros(config.vocab_size, dtype=torch.bool)
        is_digit[torch.tensor(config.abacus_digit_ids)] = True
        self.register_buffer("is_digit", is_digit, persistent=False)
        self.max_offset = config.abacus_max_offset
        self.embed = nn.Embedding(config.max_seq_len + config.abacus_max_offset + 1, config.dim)

    def forward(self, input_ids: Tensor, cache=None, attention_mask: Tensor | None = None) -> Tensor:
        is_digit = self.is_digit[input_ids]
        if attention_mask is not None:  # padding is never part of a number, whatever its token id
            is_digit = is_digit & attention_mask.bool()
        places = digit_places(is_digit, None if cache is None else cache.abacus_run)
        if cache is not None:
            cache.abacus_run = places[:, -1]  # already includes the carry when the chunk continues a run
        if self.training and self.max_offset:
            offset = torch.randint(0, self.max_offset + 1, (input_ids.shape[0], 1), device=input_ids.device)
            places = torch.where(is_digit, places + offset, places)
        places = places.clamp(max=self.embed.num_embeddings - 1)
        return self.embed(places) * is_digit[..., None].to(self.embed.weight.dtype)
