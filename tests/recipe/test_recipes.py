"""Recipes: every shipped recipe validates, overrides are type-checked, mistakes give one-line TapeErrors."""

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tapecli.errors import TapeError
from tapecli.recipe import Recipe, list_recipes, load_recipe, recipe_text

SHIPPED = [name for name, _ in list_recipes()]


def error_of(recipe: str, overrides: list[str]) -> str:
    """The message of the TapeError that loading raises; asserts it is one line."""
    with pytest.raises(TapeError) as info:
        load_recipe(recipe, overrides)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_expected_recipes_are_shipped():
    expected = {"arithmetic", "c4", "scrolls", "context-extension", "selective-copy", "grid-1d", "grid-2d",
                "flip-flop", "counting"}
    assert expected | {f"{name}-smoke" for name in expected} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_validates_and_round_trips(name, tmp_path):
    recipe = load_recipe(name, [])
    assert load_recipe(f"{name}.yaml", []) == recipe
    dumped = tmp_path / "resolved.yaml"
    dumped.write_text(recipe.to_yaml())
    assert load_recipe(str(dumped), []) == recipe
    assert Recipe.from_dict(recipe.to_dict()) == recipe


def _key_lines(text: str) -> list[tuple[str, str, bool, str]]:
    """(section, key, commented out, the line) of every key line of a recipe's YAML text."""
    found, section = [], None
    for line in text.splitlines():
        if re.match(r"^\w+:", line):
            section = line.split(":")[0]
        elif section and (match := re.match(r"^  (#\s*)?(\w+):", line)):  # the section's own keys, not nested ones
            found.append((section, match.group(2), bool(match.group(1)), line))
    return found


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_documents_exactly_what_its_kind_uses(name):
    """Shipped recipes double as documentation: each section they have spells out every key of its schema -- the
    data kind's own keys for `data` and `eval` -- as a key or, where the command, a checkpoint or a base model decides
    it, as a commented-out key; every key written carries a comment. A section exists only where it applies: `eval`
    for kinds with evaluation keys, `extend` for context extensions."""
    from dataclasses import fields

    text = recipe_text(name)
    recipe = load_recipe(name, [])
    sections = {section: {f.name for f in fields(body)} for section, body in recipe.sections().items()}
    assert set(yaml.safe_load(text)) == set(sections)
    assert ("extend" in sections) == name.startswith(("context-extension", "drope"))
    assert ("eval" in sections) == (recipe.data.kind in {"addition", "selective-copy", "grid-1d", "grid-2d",
                                                          "flip-flop", "counting", "babilong"})
    lines = _key_lines(text)
    for section, keys in sections.items():
        assert {key for s, key, _, _ in lines if s == section} == keys, section
    for section, key, commented, line in lines:
        assert commented or "#" in line.split(":", 1)[1], f"{section}.{key} has no comment"
def test_descriptions_are_first_comment_lines():
    descriptions = dict(list_recipes())
    assert all(descriptions.values())
    assert descriptions["c4-smoke"].startswith("CI/smoke")
    assert recipe_text("c4").startswith("# " + descriptions["c4"])


def test_paper_values():
    c4 = load_recipe("c4", [])
    assert (c4.train.batch_size, c4.train.max_steps, c4.train.lr, c4.data.seq_len) == (512, 10_000, 1e-4, 1024)
    assert (c4.train.warmup_steps, c4.train.grad_accum_steps, c4.train.min_lr) == (200, 64, 1e-7)
    arithmetic = load_recipe("arithmetic", [])
    assert (arithmetic.data.max_digits, arithmetic.eval.max_len, arithmetic.train.max_steps) == (40, 80, 20_000)
    extension = load_recipe("context-extension", [])
    assert (extension.model.max_seq_len, extension.data.seq_len) == (8192, 8192)
    x = extension.extend
    assert (x.lora_rank, x.lora_alpha, x.lora_dropout, x.group_fraction, x.theta) == (8, 16.0, 0.0, 0.25, 1e6)
    assert x.lora_targets == ["q_proj", "k_proj", "v_proj", "o_proj"]
    assert (extension.train.warmup_steps, extension.train.schedule) == (50, "constant")
    assert load_recipe("scrolls", []).train.seed == 2024
    drope = load_recipe("drope", [])  # DroPE's official cfgs/run_cfg/llama2_7b_drope.yaml
    assert (drope.train.batch_size, drope.train.max_steps, drope.data.seq_len) == (512, 5000, 4096)
    assert drope.train.lr == 1e-4
    assert (drope.train.warmup_steps, drope.train.schedule, drope.train.weight_decay) == (100, "cosine", 0.0)


def test_overrides_are_typed():
    recipe = load_recipe("c4", [
        "model.pe=alibi", "train.max_steps=200", "train.lr=1e-4", "train.min_lr=0", "train.compile=true",
        "model.n_kv_heads=null", "model.n_kv_heads=4", "model.ffn_dim=null", "train.betas=[0.9, 0.95]",
        "train.freeze=*.pe.*", "data.source=2024", "train.warmup=20",
    ])
    assert recipe.model.pe == "alibi"
    assert recipe.train.max_steps == 200 and isinstance(recipe.train.max_steps, int)
    assert recipe.train.lr == 1e-4 and recipe.train.min_lr == 0.0 and isinstance(recipe.train.min_lr, float)
    assert recipe.train.compile is True
    assert recipe.model.n_kv_heads == 4 and recipe.model.ffn_dim is None
    assert recipe.train.betas == [0.9, 0.95]
    assert recipe.train.freeze == ["*.pe.*"]
    assert recipe.data.source == "2024"
    assert recipe.train.warmup_steps == 20
    assert load_recipe("c4", ["train.max_steps=1e4"]).train.max_steps == 10_000
    # pe_args are free-form mappings; scrolls leaves model.pe to the checkpoint, so they are the checkpoint PE's
    scrolls = load_recipe("scrolls", ["model.pe_args.theta=500000", "model.pe_args.scaling.factor=4",
                                      "model.pe_args.base=1e6", "model.pe_args.cap=inf"])
    assert scrolls.model.pe_args == {"theta": 500000, "scaling": {"factor": 4}, "base": 1e6, "cap": float("inf")}


def test_pe_args_are_checked_by_the_model_when_the_recipe_names_the_pe():
    assert load_recipe("c4", ["model.pe=rope", "model.pe_args.theta=5e5"]).model.pe_args == {"theta": 5e5}
    assert error_of("c4", ["model.pe=alibi", "model.pe_args.theta=1"]) == (
        "model.pe_args.theta: not an argument of pe 'alibi'; allowed: (none)")
    assert "model.pe_args.theta: expected a number" in error_of("c4", ["model.pe_args.theta=fast"])  # c4 names tape


def test_one_value_parser_for_overrides_and_pe_args():
    """`--pe-arg a=inf` and `model.pe_args.a=inf` read the same value (they once gave a float and a string)."""
    from tapecli.eval.common import parse_pe_args
    from tapecli.recipe.values import parse_value

    for raw in ["inf", "-inf", "1e6", "1.5e-3", "2", "linear", "null", "true", "[1, 2e3]", "{a: 1e2}", "*.pe.*"]:
        from_override = load_recipe("scrolls", [f"model.pe_args.a={raw}"]).model.pe_args["a"]
        from_pe_arg = parse_pe_args([f"a={raw}"])["a"]
        assert from_override == from_pe_arg == parse_value(raw), raw
        assert type(from_override) is type(from_pe_arg)
    assert parse_value("inf") == float("inf") and parse_value("[1, 2e3]") == [1, 2000.0]
    assert parse_value("*.pe.*") == "*.pe.*" and parse_value("1e6") == 1e6 and parse_value("2") == 2


def test_overrides_do_not_leak_between_loads():
    load_recipe("scrolls", ["model.pe_args.factor=4", "model.pe_args.yarn.beta=1"])
    assert load_recipe("scrolls", []).model.pe_args == load_recipe("scrolls.yaml", []).model.pe_args == {}


@pytest.mark.parametrize(("override", "expected"), [
    ("train.max_step=3", "unknown key 'train.max_step' (did you mean 'train.max_steps'?)"),
    ("modle.pe=rope", "unknown key 'modle.pe' (did you mean 'model.pe'?)"),
    ("train.max_steps=abc", "train.max_steps: expected an integer or null, got 'abc'"),
    ("train.max_steps=2.5", "train.max_steps: expected an integer or null, got 2.5"),
    ("train.lr=fast", "train.lr: expected a number"),
    ("train.compile=maybe", "train.compile: expected true or false"),
    ("model.n_kv_heads=x", "model.n_kv_heads: expected an integer or null"),
    ("train.betas=0.9", "train.betas: expected a list"),
    ("train.betas=[0.9]", "train.betas: expected a list of 2 floats"),
    ("model.pe=foo", "model.pe: unknown positional encoding 'foo'; allowed: nope, rope"),
    ("train.precision=fp8", "train.precision: expected one of auto, fp32, bf16, fp16; got 'fp8'"),
    ("train.schedule=step", "train.schedule: expected one of linear, cosine, constant"),
    ("data.kind=images", "data.kind: expected one of text, pairs, addition"),
    ("train.batch_size=100", "train.batch_size: 100 is not divisible by train.micro_batch_size (8)"),
    ("train.warmup=10000", "train.warmup: 10000 warm-up steps must be fewer than train.max_steps"),
    ("data.seq_len=2048", "data.seq_len: 2048 exceeds model.max_seq_len (1024)"),
    ("data.source=null", "data.source: data.kind 'text' needs a source"),
    ("data.kind=addition", "c4.yaml: data.source is not a key of kind addition"),
    ("data.tokenizer=synthetic", "data.tokenizer: 'synthetic' is the tokenizer of generated data"),
    ("model.n_heads=5", "model.dim: 768 is not divisible by model.n_heads=5"),
    ("model.ffn_dim=0", "model.ffn_dim: expected a positive integer, got 0"),
    ("model.norm_eps=0", "model.norm_eps: must be > 0, got 0.0"),
    ("train.lr=-1e-4", "train.lr: must be >= 0, got -0.0001"),
    ("model.dim.x=1", "unknown key 'model.dim.x'"),
    ("model=1", "'model' is a section"),
    ("train.max_steps", "override 'train.max_steps' must look like key=value"),
    ("model.dropout=1.0", "model.dropout: must be in [0, 1), got 1.0"),
    ("train.epochs=3", "train.epochs: counts passes over a fixed training set of data.train_size sequences: "
                       "data.kind 'text' has no fixed training set; use train.max_steps"),
    ("train.max_steps=null", "train.max_steps: null needs train.epochs"),
])
def test_bad_overrides(override, expected):
    assert expected in error_of("c4", [override])


def test_epochs_set_max_steps_over_a_fixed_training_set():
    """train.epochs over data.train_size sequences: ceil(epochs x train_size / batch_size) steps (a batch runs on
    into the next epoch), recorded in the resolved recipe, which loads back; a max_steps that disagrees is an error
    naming both keys."""
    recipe = load_recipe("grid-1d-smoke", ["data.train_size=20", "train.epochs=3", "train.max_steps=null"])
    assert recipe.train.max_steps == 8  # 3 x 20 / 8 = 7.5
    assert load_recipe("grid-1d-smoke", ["data.train_size=20", "train.epochs=3", "train.max_steps=8"]) == recipe
    assert Recipe.from_dict(recipe.to_dict()) == recipe
    message = error_of("grid-1d-smoke", ["data.train_size=20", "train.epochs=3"])  # the file's max_steps: 4
    assert message.startswith("train.max_steps: 4 disagrees with train.epochs=3 over data.train_size=20 at batch 8 "
                              "(8 steps)")
    assert error_of("grid-1d-smoke", ["train.epochs=3"]).startswith("train.epochs: counts passes over a fixed "
                                                                    "training set of data.train_size sequences: set "
                                                                    "data.train_size")
    assert error_of("grid-1d-smoke", ["train.epochs=0", "data.train_size=8"]).startswith("train.epochs: must be a "
                                                                                        "positive integer")


def test_addition_needs_room_for_its_problems():
    message = error_of("arithmetic", ["data.max_digits=80"])
    assert message.startswith("data.seq_len: 128 is too short for 80-digit addition")


def test_unknown_recipe_lists_shipped():
    message = error_of("c5.yaml", [])
    assert message.startswith("recipe 'c5.yaml' not found")
    assert "shipped recipes: arithmetic, " in message and "c4" in message


def test_name_lookup_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert load_recipe("c4.yaml", []) == load_recipe("c4", [])


def test_path_and_file_errors(tmp_path):
    good = tmp_path / "mine.yaml"
    good.write_text("model:\n  pe: rope\ndata:\n  source: corpus.txt\n")
    recipe = load_recipe(str(good), ["train.max_steps=5", "train.warmup=0"])
    assert (recipe.model.pe, recipe.train.max_steps, recipe.data.source) == ("rope", 5, "corpus.txt")

    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text("train:\n  lr: 1e-4\n  max_step: 3\n")
    message = error_of(str(bad_key), [])
    assert "bad.yaml" in message and "unknown key 'train.max_step' (did you mean 'train.max_steps'?)" in message

    bad_type = tmp_path / "type.yaml"
    bad_type.write_text("train:\n  max_steps: many\n")
    assert error_of(str(bad_type), []) == (f"{bad_type}: train.max_steps: expected an integer or null, got "
                                           "'many'")

    bad_section = tmp_path / "section.yaml"
    bad_section.write_text("optim:\n  lr: 1\n")
    assert "section.yaml: unknown key 'optim'" in error_of(str(bad_section), [])

    not_yaml = tmp_path / "broken.yaml"
    not_yaml.write_text("model: [\n")
    assert "broken.yaml: not valid YAML" in error_of(str(not_yaml), [])


def test_model_config_kwargs():
    recipe = load_recipe("c4-smoke", [])
    kwargs = recipe.model_config_kwargs(tokenizer_vocab_size=259)
    assert kwargs["vocab_size"] == 259 and kwargs["abacus"] is False and kwargs["pe"] == "tape"
    assert set(kwargs) == set(recipe.to_dict()["model"])
    with pytest.raises(TapeError, match="model.vocab_size: 100 is smaller than the tokenizer's vocabulary"):
        load_recipe("c4-smoke", ["model.vocab_size=100"]).model_config_kwargs(tokenizer_vocab_size=259)


@pytest.mark.parametrize("name", [n for n, _ in list_recipes()])
def test_shipped_model_sections_build_a_valid_model_config(name):
    """pe_args are free-form in the recipe schema; the model validates them, so every shipped recipe must pass."""
    from tapecli.model import ModelConfig

    ModelConfig(**load_recipe(name, []).model_config_kwargs(tokenizer_vocab_size=300))


def test_shipped_recipes_are_package_data_of_the_wheel(tmp_path):
    """`--recipe c4` and `--recipe recipes/c4.yaml` must work after a non-editable `pip install .`: the YAML files of
    the top-level recipes/ ship in the wheel as tapecli/recipe/shipped/ (setup.py), and the installed package finds
    them there, away from any checkout."""
    repo = Path(__file__).resolve().parents[2]
    assert {name for name, _ in list_recipes()} == {p.stem for p in (repo / "recipes").glob("*.yaml")}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp_path), str(repo)], check=True, capture_output=True, timeout=300)
    wheel = next(tmp_path.glob("tapecli-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"tapecli/recipe/shipped/{name}.yaml" for name, _ in list_recipes()} <= names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # what pip install puts in site-packages
    probe = ("from tapecli.recipe.files import locate, shipped_dir; import tapecli; "
             "print(tapecli.__file__); print(shipped_dir()); "
             "print(locate('c4')[1] == locate('recipes/c4.yaml')[1] == locate('c4.yaml')[1])")
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(site)!r}); {probe}"],
                         cwd=tmp_path, check=True, capture_output=True, text=True, timeout=120).stdout.split("\n")
    assert out[0].startswith(str(site)) and out[1] == str(site / "tapecli" / "recipe" / "shipped") and out[2] == "True"


def test_extend_exists_only_for_context_extensions():
    assert load_recipe("c4-smoke").extend is None and "extend" not in load_recipe("c4-smoke").to_dict()
    assert load_recipe("context-extension").extend.method == "tape"  # the section is there: --method's default
    extended = load_recipe("c4-smoke", ["extend.method=lora"])  # what `tape extend-context --method lora` sets
    assert extended.extend.method == "lora" and extended.extend.lora_rank == 8
    assert extended.set_values("extend") == {"method": "lora"} and load_recipe("c4-smoke").set_values("extend") == {}


def test_a_warm_up_that_does_not_fit_a_shorter_run_from_the_command_line_is_shortened_with_a_note():
    smoke = load_recipe("c4-smoke", ["train.max_steps=1"])  # the file says warmup: 1
    assert smoke.train.warmup == 1 and smoke.train.warmup_steps == 0
    assert smoke.notes == ("train.warmup: 1 warm-up steps do not fit train.max_steps=1; warming up for 0",)
    assert load_recipe("c4-smoke").notes == () and load_recipe("c4-smoke").train.warmup_steps == 1
    fraction = load_recipe("c4", ["train.max_steps=1"])  # 0.02 of 1 step rounds to 0: nothing to say
    assert (fraction.train.warmup_steps, fraction.notes) == (0, ())
    assert load_recipe("c4", ["train.max_steps=1", "train.warmup=0.9"]).train.warmup_steps == 0  # rounds to fit
    assert load_recipe("c4", ["train.max_steps=4", "train.warmup=0.9"]).train.warmup_steps == 3


def test_a_runs_recipe_with_a_shortened_warm_up_reads_back(tmp_path):
    """RUN/recipe.yaml of `train.max_steps=1` on a recipe with `warmup: 1` (training shortened the warm-up) is read
    back by everything that opens the run (tape analyze, babilong, sweep), as the training read it."""
    from tapecli.store.run import run_recipe

    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000001").mkdir(parents=True)
    (run / "recipe.yaml").write_text(load_recipe("c4-smoke", ["train.max_steps=1"]).to_yaml())
    with pytest.raises(TapeError, match="train.warmup"):
        load_recipe(str(run / "recipe.yaml"))  # as a recipe of its own, the count does not fit
    recipe = run_recipe(run / "checkpoints" / "step-00000001")
    assert (recipe.train.max_steps, recipe.train.warmup_steps) == (1, 0)


def test_a_warm_up_the_user_sets_too_long_is_an_error_naming_the_fix(tmp_path):
    message = error_of("c4-smoke", ["train.max_steps=1", "train.warmup=1"])
    assert message == ("train.warmup: 1 warm-up steps must be fewer than train.max_steps (1); lower it, or give a "
                       "fraction of the steps (e.g. train.warmup=0.02)")
    mine = tmp_path / "mine.yaml"
    mine.write_text("data: {source: x.txt}\ntrain: {max_steps: 5, warmup: 5}\n")
    assert error_of(str(mine), []).startswith("train.warmup: 5 warm-up steps must be fewer than train.max_steps (5)")


def test_a_zero_learning_rate_is_allowed():
    recipe = load_recipe("c4-smoke", ["train.lr=0"])
    assert recipe.train.lr == 0.0 and recipe.train.min_lr == 0.0
    assert error_of("c4-smoke", ["train.lr=0", "train.min_lr=1e-5"]) == "train.min_lr: 1e-05 exceeds train.lr (0.0)"


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipes_hold_no_key_their_run_ignores(name):
    assert load_recipe(name, []).unused_keys() == []


@pytest.mark.parametrize("recipe, overrides, key", [
    ("counting-smoke", ["train.min_lr=0.0"], "train.min_lr"),  # a constant schedule has no end of decay
    ("scrolls", ["data.tokenizer=byte"], "data.tokenizer"),  # train.init_from: the model brings its tokenizer
    ("babilong-example", ["data.depth_window=0.3"], "data.depth_window"),  # data.depths null: no window
])
def test_a_key_the_other_options_make_meaningless_is_noted(recipe, overrides, key):
    loaded = load_recipe(recipe, overrides)
    assert [note.split(":")[0] for note in loaded.unused_keys()] == [key]
    assert any(note.startswith(f"{key}: unused") for note in loaded.notes)  # printed by the training commands
    assert load_recipe(recipe, overrides[:-1]).unused_keys() == []  # without the key: nothing to say
