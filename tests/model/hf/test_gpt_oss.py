"""GPT-OSS (`GptOssForCausalLM`): attention sinks, alternating sliding / full layers and YaRN, which tape has
(`model.sinks`, schedules, `--scaling yarn`), around a mixture-of-experts MLP, which tape's block does not have. A tiny
GPT-OSS built and saved by transformers is refused in one line naming what is missing, by the door and on the command
line, before anything is written."""

from __future__ import annotations

import pytest
from cli_helpers import one_line_error
from hf_helpers import make_hf_model
from typer.testing import CliRunner

from tapecli.cli import app
from tapecli.errors import TapeError
from tapecli.store.door import open_model

MISSING = ("architectures ['GptOssForCausalLM'] is not supported; the nearest supported is MistralForCausalLM; "
           "GPT-OSS's mixture-of-experts MLP (a router over experts) is not mapped: tape's block has one dense MLP "
           "(its attention sinks are model.sinks)")


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory):
    directory = tmp_path_factory.mktemp("gpt-oss") / "hf"
    model = make_hf_model(directory, "GptOssForCausalLM", hidden_size=32, intermediate_size=32, head_dim=8,
                          num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                          layer_types=["sliding_attention", "full_attention"] * 2)
    assert any(name.endswith("self_attn.sinks") for name, _ in model.named_parameters())
    assert any(".mlp.experts." in name for name, _ in model.named_parameters())
    return directory


def test_the_door_names_the_experts(gpt_oss):
    with pytest.raises(TapeError) as info:
        open_model(str(gpt_oss), device="cpu")
    assert str(info.value) == f"{gpt_oss / 'config.json'}: {MISSING}"


def test_extend_context_refuses_it_in_one_line(gpt_oss, tmp_path):
    out, corpus = tmp_path / "run", tmp_path / "corpus.txt"
    corpus.write_text("a few words of text\n" * 50)
    result = CliRunner().invoke(app, ["extend-context", "--base", str(gpt_oss), "--recipe", "context-extension-smoke",
                                      "--out", str(out), f"data.source={corpus}"])
    one_line_error(result, 2, MISSING)
    assert not out.exists()
