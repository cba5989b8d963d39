"""Special tokens: tape encodes every text as the model's own tokenizer does by default, and as lm-eval's HFLM does.

- A Hugging Face directory's default special tokens (`Tokenizer.encode(text, add_special_tokens=True)`) equal what
  transformers' AutoTokenizer adds, for the tokenizer behaviours real models have: adds BOS (Llama 2), adds nothing
  (SmolLM2, GPT-2), adds another begin-of-text token (Llama 3), has no BOS at all (Qwen), no post-processor, and a
  SentencePiece-only directory with and without `add_bos_token`.
- `TapeLM` equals HFLM per request (token ids, loglikelihoods and greedy flags, rolling loglikelihoods, greedy
  generations) on tiny trained Llamas with those tokenizers, with `add_bos_token` unset, true and false, including
  strings that already start with the BOS text and empty contexts.
- tape's own tokenizers put BOS first; an imported tokenizer keeps its default through save / load.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_helpers import TOKENIZER_STYLES, make_trained_llama, save_sp_tokenizer, save_styled_tokenizer

TRAIN_TEXT = ("Question: What color is the sky?\nAnswer: blue\nQuestion: What is two plus two?\nAnswer: four\n"
              "Q: what is two plus two?\nA: four\nQ: what color is the sky?\nA: blue\nQ: what does the fox do?\n"
              "A: jumps\nthe sky is blue and the grass is green. a quick brown fox jumps over the lazy dog.\n")
MAX_LENGTH = 32
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def llamas(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("styled_llamas")
    return {style: make_trained_llama(root / style, style, TRAIN_TEXT, steps=40) for style in TOKENIZER_STYLES}


# ---------------------------------------------------------------------------------------------------------------
# The tokenizer's defaults


TEXTS = ["the sky is blue", "", " a quick\nbrown fox", "<s>the sky", "<|begin_of_text|>the sky", "<|im_start|>A:"]


def _variants(root: Path) -> dict[str, Path]:
    """Directories beyond the four styles: the edge cases of transformers' rule."""
    from tokenizers import Tokenizer

    found = {}
    for style in TOKENIZER_STYLES:
        save_styled_tokenizer(root / style, style, [TRAIN_TEXT] * 4)
        found[style] = root / style
    # A tokenizer.json whose config says add_bos_token: false and add_eos_token: true: transformers 5 ignores both.
    ignored = root / "config-ignored"
    save_styled_tokenizer(ignored, "llama3", [TRAIN_TEXT] * 4)
    config = json.loads((ignored / "tokenizer_config.json").read_text())
    (ignored / "tokenizer_config.json").write_text(json.dumps({**config, "add_bos_token": False,
                                                                "add_eos_token": True}))
    found["config-ignored"] = ignored
    # No post-processor at all: nothing is added.
    bare = root / "no-post-processor"
    save_styled_tokenizer(bare, "llama3", [TRAIN_TEXT] * 4)
    backend = Tokenizer.from_file(str(bare / "tokenizer.json"))
    backend.post_processor = None
    backend.save(str(bare / "tokenizer.json"))
    found["no-post-processor"] = bare
    # SentencePiece only: tokenizer_config.json's add_bos_token decides (transformers 5's default: false).
    for name, config in [("sp-add-bos", {"add_bos_token": True}), ("sp-unset", {}),
                         ("sp-add-eos", {"add_bos_token": True, "add_eos_token": True})]:
        (root / name).mkdir()
        save_sp_tokenizer(root / name)
        (root / name / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "LlamaTokenizer",
                                                                       **config}))
        found[name] = root / name
    return found


def test_default_special_tokens_equal_transformers_autotokenizer(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from tapecli.data.tokenizer import SentencePieceTokenizer
    from tapecli.model.hf.load import load_hf_tokenizer

    expected = {"llama2": ([1], []), "smollm2": ([], []), "qwen": ([], []), "no-post-processor": ([], []),
                "sp-add-bos": ([1], []), "sp-unset": ([], []), "sp-add-eos": ([1], [2])}
    for name, directory in _variants(tmp_path).items():
        reference = AutoTokenizer.from_pretrained(directory)
        tok = load_hf_tokenizer(directory, {})
        before, after = tok.default_specials
        assert (before, after) == expected.get(name, ([tok.bos_id], [])), name
        assert tok.has_bos == (reference.bos_token_id is not None), name
        if reference.bos_token_id is not None:
            assert tok.bos_id == reference.bos_token_id, name
        assert tok.eos_id == reference.eos_token_id, name
        # SentencePiece-only directories: transformers converts the model to a `tokenizers` BPE whose splits of
        # some texts differ from sentencepiece's own; the special tokens around a text are what matters here.
        texts = ["the sky is blue"] if isinstance(tok, SentencePieceTokenizer) else TEXTS
        for text in texts:
            assert tok.encode(text, add_special_tokens=True) == reference.encode(text), (name, text)
            assert tok.encode(text) == reference.encode(text, add_special_tokens=False), (name, text)


def test_defaults_survive_save_and_load_and_tape_tokenizers_start_with_bos(tmp_path: Path) -> None:
    from tapecli.data.tokenizer import ByteTokenizer, CharTokenizer, load_tokenizer, load_tokenizer_dir
    from tapecli.model.hf.load import load_hf_tokenizer

    for style in ("smollm2", "qwen", "llama3"):
        save_styled_tokenizer(tmp_path / style, style, [TRAIN_TEXT] * 4)
        tok = load_hf_tokenizer(tmp_path / style, {})
        back = load_tokenizer_dir(tok.save(tmp_path / f"{style}-saved"))
        assert (back.default_specials, back.has_bos, back.bos_id, back.eos_id) == (
            tok.default_specials, tok.has_bos, tok.bos_id, tok.eos_id)
        assert back.encode("the sky", add_special_tokens=True) == tok.encode("the sky", add_special_tokens=True)
    # Llama 3's default is its BOS: nothing extra is saved, so the tokenizer's files stay as before.
    meta = json.loads((tmp_path / "llama3-saved" / "tokenizer_meta.json").read_text())
    assert "default_specials" not in meta and "has_bos" not in meta
    # tape's own tokenizers, and a tokenizer.json named by a recipe: BOS before the text, nothing after.
    for tok in (ByteTokenizer(), CharTokenizer("synthetic"), load_tokenizer(str(tmp_path / "smollm2" /
                                                                                "tokenizer.json"))):
        assert tok.default_specials == ([tok.bos_id], []) and tok.has_bos
        assert tok.encode("ab|", add_special_tokens=True) == [tok.bos_id, *tok.encode("ab|")]
    # ... except the addition task's, which trains and evaluates prompts without BOS
    addition = CharTokenizer("addition")
    assert addition.encode("1+2=", add_special_tokens=True) == addition.encode("1+2=")
    assert load_tokenizer_dir(addition.save(tmp_path / "addition")).default_specials == ([], [])
    assert json.loads((tmp_path / "addition" / "tokenizer_meta.json").read_text()) == {"kind": "addition"}
    described = ByteTokenizer().describe_specials([256], [257])
    assert described == {"before": [256], "after": [257], "layout": "BOS {text} EOS"}


# ---------------------------------------------------------------------------------------------------------------
# TapeLM against HFLM, request by request


def _requests(bos_text: str) -> dict[str, list]:
    from lm_eval.api.instance import Instance

    pairs = [("Question: What color is the sky?\nAnswer:", " blue"), ("Question: What color is the sky?\nAnswer:",
             " green"), ("", "the sky is blue"), ("Q: what is two plus two?\nA:", " four"),
             (bos_text + "Q: what is two plus two?\nA:", " four"), ("the sky is", " blue and the grass"),
             ("the sky is blue and the grass is green and the fox jumps over the lazy dog. " * 2 + "the grass is",
              " green")]
    documents = ["the sky is blue and the grass is green. " * 3, "a quick brown fox", bos_text + "the sky is blue"]
    greedy = {"until": ["\n"], "max_gen_toks": 8, "do_sample": False}
    prompts = ["Q: what is two plus two?\nA:", "Q: what color is the sky?\nA:", "the sky is", "Q: what does the fox"]
    return {
        "loglikelihood": [Instance("loglikelihood", {}, pair, i) for i, pair in enumerate(pairs)],
        "loglikelihood_rolling": [Instance("loglikelihood_rolling", {}, (d,), i) for i, d in enumerate(documents)],
        "generate_until": [Instance("generate_until", {}, (p, dict(greedy)), i) for i, p in enumerate(prompts)],
        # one batch of its own: HFLM decides for a whole generation batch from its first prompt
        "generate_bos": [Instance("generate_until", {}, (bos_text + prompts[1], dict(greedy)), 0)],
    }


CASES = [(style, None) for style in TOKENIZER_STYLES] + [(s, flag) for s in ("smollm2", "llama3") for flag in
                                                          (True, False)]


@pytest.mark.parametrize(("style", "add_bos"), CASES, ids=[f"{s}-add_bos={b}" for s, b in CASES])
def test_tape_lm_equals_hflm_request_by_request(llamas: dict[str, Path], style: str, add_bos: bool | None) -> None:
    from lm_eval.models.huggingface import HFLM

    from tapecli.eval.lm_adapter import TapeLM

    reference = HFLM(pretrained=str(llamas[style]), max_length=MAX_LENGTH, dtype="float32", batch_size=1,
                     device="cpu", add_bos_token=add_bos)
    ours = TapeLM(pretrained=str(llamas[style]), max_length=MAX_LENGTH, dtype="fp32", batch_size=3, device="cpu",
                  add_bos_token=add_bos)
    assert ours.prefix_token_id == reference.prefix_token_id
    assert ours.eot_token_id == reference.eot_token_id
    bos_text = reference.tokenizer.decode(reference.prefix_token_id)
    requests = _requests(bos_text)
    strings = [*{text for r in requests["loglikelihood"] for text in r.args if text},
               *(r.args[0] for r in requests["loglikelihood_rolling"])]
    for text in strings:
        for add in (None, True, False):
            assert ours.tok_encode(text, add_special_tokens=add) == reference.tok_encode(
                text, add_special_tokens=add), (text, add)
    for request in ("loglikelihood", "loglikelihood_rolling"):
        got, want = (getattr(lm, request)(requests[request], disable_tqdm=True) for lm in (ours, reference))
        if request == "loglikelihood":
            assert [g for _, g in got] == [g for _, g in want]
            got, want = [lp for lp, _ in got], [lp for lp, _ in want]
        assert got == pytest.approx(want, rel=1e-5, abs=1e-4), request
    for request in ("generate_until", "generate_bos"):
        got, want = (lm.generate_until(requests[request], disable_tqdm=True) for lm in (ours, reference))
        assert got == want, request
    flags = [g for _, g in ours.loglikelihood(requests["loglikelihood"], disable_tqdm=True)]
    assert any(flags) and not all(flags)  # the trained model makes the greedy flags mean something
    assert any(ours.generate_until(requests["generate_until"], disable_tqdm=True))


def test_settings_say_which_special_tokens_are_added(llamas: dict[str, Path]) -> None:
    from tapecli.eval.lm_adapter import TapeLM

    default = TapeLM(pretrained=str(llamas["smollm2"]), device="cpu").settings()
    assert default["add_bos_token"] is None
    assert default["special_tokens"] == {"before": [], "after": [], "layout": "{text}",
                                         "prefix_token": "<|im_start|>"}
    forced = TapeLM(pretrained=str(llamas["smollm2"]), device="cpu", add_bos_token="true").settings()
    assert forced["special_tokens"]["layout"] == "<|im_start|> {text}"
    qwen = TapeLM(pretrained=str(llamas["qwen"]), device="cpu", add_bos_token=True).settings()
    assert qwen["special_tokens"]["layout"] == "{text}" and qwen["special_tokens"]["prefix_token"] == "<|endoftext|>"


# ---------------------------------------------------------------------------------------------------------------
# The other evaluations that encode text


@pytest.mark.parametrize("style", ["llama2", "smollm2", "llama3"])
def test_perplexity_and_passkey_encode_as_the_model_s_tokenizer(llamas: dict[str, Path], tmp_path: Path,
                                                                 style: str) -> None:
    from transformers import AutoTokenizer

    from tapecli.eval.passkey import encode_prompt, evaluate_passkey, make_prompt
    from tapecli.eval.perplexity import evaluate_perplexity, load_stream
    from tapecli.model.hf.load import load_hf_tokenizer

    reference = AutoTokenizer.from_pretrained(llamas[style])
    tok = load_hf_tokenizer(llamas[style], {})
    docs = ["the sky is blue and the grass is green.", "a quick brown fox jumps over the lazy dog."]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    # perplexity: each document as `tokenizer(document)` gives it, then EOS
    expected = [i for d in docs for i in [*reference(d).input_ids, reference.eos_token_id]]
    assert load_stream(str(tmp_path / "docs.jsonl"), tok).tolist() == expected
    results = evaluate_perplexity([str(llamas[style])], str(tmp_path / "docs.jsonl"), [8], tmp_path / "ppl",
                                  protocol="disjoint", device="cpu", dtype="fp32", show_progress=False)
    bos = {"llama2": "<s> ", "smollm2": "", "llama3": "<|begin_of_text|> "}[style]
    eos = reference.eos_token
    assert results["models"][0]["special_tokens"]["layout"] == f"{bos}{{text}} {eos}"
    # passkey: the prompt as the official `tokenizer(prompt)` gives it
    prompt = make_prompt(64, 3)
    assert encode_prompt(tok, prompt)[0] == reference(prompt.text).input_ids
    results = evaluate_passkey(str(llamas[style]), tmp_path / "passkey", budgets=[16], trials=1, device="cpu",
                               dtype="fp32", show_progress=False)
    assert results["special_tokens"]["layout"] == f"{bos}{{text}}"
    assert json.loads((tmp_path / "passkey" / "results.json").read_text())["special_tokens"] == \
        results["special_tokens"]


def test_export_keeps_the_default_special_tokens(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from tapecli.data.tokenizer import load_tokenizer, train_tokenizer
    from tapecli.model import ModelConfig, Transformer
    from tapecli.model.hf.export import export_hf
    from tapecli.model.hf.load import load_hf_tokenizer

    for style in ("smollm2", "llama3"):
        save_styled_tokenizer(tmp_path / style, style, [TRAIN_TEXT] * 4)
    (tmp_path / "corpus.txt").write_text(TRAIN_TEXT * 20)
    tokenizers = {
        "imported smollm2 (adds nothing)": load_hf_tokenizer(tmp_path / "smollm2", {}),
        "imported llama3 (its own template)": load_hf_tokenizer(tmp_path / "llama3", {}),
        "a recipe's tokenizer.json (tape's rule: BOS)": load_tokenizer(str(tmp_path / "smollm2" / "tokenizer.json")),
        "tape tokenizer train (BOS)": load_tokenizer(str(train_tokenizer(str(tmp_path / "corpus.txt"), 300,
                                                                         str(tmp_path / "sp.model")))),
    }
    for i, (name, tok) in enumerate(tokenizers.items()):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=tok.vocab_size, dim=32, n_layers=1, n_heads=2, max_seq_len=16))
        export_hf(model, tok, tmp_path / f"export{i}")
        exported = AutoTokenizer.from_pretrained(tmp_path / f"export{i}")
        for text in ("the sky is blue", "Q: what is two plus two?"):
            assert exported.encode(text) == tok.encode(text, add_special_tokens=True), name
        assert (exported.bos_token_id is not None) == tok.has_bos, name
