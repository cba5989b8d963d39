"""Our LoRA layer against a dense reference, and LongLoRA's S²-Attn against a direct construction of its mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from numerics import assert_close_to_rounding

from tapecli.model import ModelConfig, Transformer
from tapecli.model.extend.lora import LoRALinear, LoraSpec, apply_lora, merge_lora
from tapecli.model.extend.s2attn import enable_s2_attn, s2_attention, s2_mask


def test_lora_linear_equals_dense_reference_and_trains_only_adapters():
    torch.manual_seed(0)
    base = torch.nn.Linear(12, 10, bias=False)
    layer = LoRALinear(base, LoraSpec(rank=4, alpha=8.0))
    assert layer.weight is base.weight and layer.lora_A.shape == (4, 12) and layer.lora_B.shape == (10, 4)
    x = torch.randn(3, 5, 12)
    assert torch.equal(layer(x), base(x))  # B starts at zero
    torch.nn.init.normal_(layer.lora_B)
    dense = base.weight + 2.0 * layer.lora_B @ layer.lora_A  # alpha / r = 2
    with torch.no_grad():  # the reference in fp64; the tolerance: fp32 rounding of 16-term sums of |x| |W| terms
        assert_close_to_rounding(layer(x), x.double() @ dense.double().T, scale=(x.abs() @ dense.abs().T).max(),
                                 ulps=16)
    base.weight.requires_grad_(False)
    layer(x).square().sum().backward()
    assert base.weight.grad is None and layer.lora_A.grad is not None and layer.lora_B.grad is not None
    with torch.no_grad():
        assert_close_to_rounding(layer.merged_weight(), base.weight.double() + 2.0 * layer.lora_B.double()
                                 @ layer.lora_A.double(), scale=(base.weight.abs() + 2.0 * layer.lora_B.abs()
                                                                 @ layer.lora_A.abs()).max(), ulps=16)


def test_apply_and_merge_lora_on_a_model():
    config = ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, pe="rope")
    torch.manual_seed(0)
    model = Transformer(config).eval()
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        reference = model(x)
    names = apply_lora(model, LoraSpec())
    assert len(names) == 2 * 4 * 2 and "model.layers.0.self_attn.k_proj.lora_B" in names
    assert "model.layers.0.self_attn.q_proj.weight" in dict(model.named_parameters())  # base names unchanged
    with torch.no_grad():
        assert torch.equal(model(x), reference)
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(std=0.1)
        adapted = model(x)
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    with torch.no_grad():
        torch.testing.assert_close(model(x), adapted, rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="qkv_proj"):
        apply_lora(model, LoraSpec(targets=["qkv_proj"]))


@pytest.mark.parametrize("T, group", [(32, 8), (64, 16), (16, 4)])
def test_s2_attention_equals_the_masked_reference(T, group):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, T, 8, generator=g) for _ in range(3))
    mask = s2_mask(T, group, 4)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close_to_rounding(s2_attention(q, k, v, group), expected, scale=v.abs().max())  # averages of v
    # The mask itself: heads 0-1 attend within [0, G), [G, 2G), ...; heads 2-3 within [0, G/2), [G/2, 3G/2), ...
    assert mask[0, group - 1, 0] and not mask[0, group, group - 1]
    assert mask[3, group // 2 + 1, group // 2] and not mask[3, group // 2, group // 2 - 1]
    assert not mask[:, 0, 1].any()  # causal


def test_s2_attn_is_training_only():
    config = ModelConfig(vocab_size=50, dim=32, n_layers=2, n_heads=4, pe="rope")
    torch.manual_seed(0)
    model = Transformer(config)
    x = torch.randint(0, 50, (1, 32))
    with torch.no_grad():
        full_train, full_eval = model.train()(x), model.eval()(x)
        enable_s2_attn(model, 0.25)
        assert torch.equal(model.eval()(x), full_eval)
        sparse = model.train()(x)
    assert not torch.allclose(sparse, full_train)
    # The first half group (first group of the shifted heads) sees exactly what full causal attention sees.
    assert_close_to_rounding(sparse[:, :4], full_train[:, :4])
