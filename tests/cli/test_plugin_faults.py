"""A plugin PE that breaks the PE API, or whose own code raises, is reported in one line naming the plugin and the
hook, in training and in evaluation (it used to surface as an IndexError deep inside attention); `--debug` keeps
the traceback. A plugin that calls sys.exit at import is one line too (tests/model/test_plugins.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_helpers import one_line_error
from plugin_helpers import SOURCE
from typer.testing import CliRunner

from tapecli import trust
from tapecli.cli import app

runner = CliRunner()
pytestmark = pytest.mark.usefixtures("one_thread")
SMOKE = ("--recipe", "selective-copy-smoke", "train.max_steps=1", "train.save_every=1", "train.eval_every=0",
         "train.warmup=0")


@pytest.fixture(autouse=True)
def nothing_allowed(monkeypatch):
    monkeypatch.delenv(trust.ALLOW_ENV, raising=False)


def plugin(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """The learned-ALiBi plugin of plugin_helpers with one line changed."""
    assert old in SOURCE
    path = tmp_path / f"{name}.py"
    path.write_text(SOURCE.replace(old, new))
    return path


DROPPED_HEADS = ("return -self.slopes[:, None] * torch.arange(", "return -self.slopes.mean() * torch.arange(")


def test_a_bias_of_the_wrong_shape_names_the_plugin_and_its_hook(tmp_path: Path) -> None:
    path = plugin(tmp_path, "flat", *DROPPED_HEADS)
    value = f"{path}:LearnedALiBi"
    result = runner.invoke(app, ["pretrain", *SMOKE, "--out", str(tmp_path / "run"), f"model.pe={value}"])
    n = one_line_error(result, 2).split("for n = ")[1].split(";")[0]
    assert one_line_error(result, 2) == (  # one number in the shape: the heads are missing
        f"error: the plugin PE {value} broke the PE API: SlopeLayer.table (ScoreBias.table) returned shape [{n}] "
        f"for n = {n}; the contract is [H, m] = [2, m] with 1 <= m <= {n}; fix the plugin (`tape --debug ...` shows "
        f"the traceback) and check it with `tape pe check {value}`")
    debug = runner.invoke(app, ["--debug", "pretrain", *SMOKE, "--out", str(tmp_path / "run2"), f"model.pe={value}"])
    assert type(debug.exception).__name__ == "ContractError"


def test_an_error_raised_in_a_plugins_hook_names_it_in_training_and_in_evaluation(tmp_path: Path) -> None:
    path = plugin(tmp_path, "raising", "        return ScoreBias(", "        if state.positions.shape[-1] > 13:\n"
                  "            raise KeyError('no such slope')\n        return ScoreBias(")
    value = f"{path}:LearnedALiBi"
    result = runner.invoke(app, ["pretrain", *SMOKE, "--out", str(tmp_path / "run"), f"model.pe={value}"])
    assert result.exit_code == 0, result.output  # it trains: the hook raises past the 13 training tokens
    result = runner.invoke(app, ["--allow-pe", str(path), "eval", "synthetic", "-m", str(tmp_path / "run"),
                                 "--samples", "2", "--device", "cpu", "--out", str(tmp_path / "eval")])
    assert one_line_error(result, 2) == (
        f"error: the plugin PE {value} failed in SlopeLayer.need: KeyError: 'no such slope'; fix the plugin "
        f"(`tape --debug ...` shows the traceback) and check it with `tape pe check {value}`")


def test_a_score_mod_that_is_not_a_module_level_scoremod_is_refused_on_every_device(tmp_path: Path) -> None:
    """A bound method as ScoreBias.score_mod used to pass every CPU check and fail at the first FlexAttention call
    on CUDA; a ScoreMod of a bound method would compile one kernel per layer there. Both are refused when made."""
    from tapecli.pe import ScoreBias, ScoreMod

    path = plugin(tmp_path, "bound", "parameters=(self.slopes,))", "parameters=(self.slopes,), score_mod=self.pairs)")
    value = f"{path}:LearnedALiBi"
    result = runner.invoke(app, ["pretrain", *SMOKE, "--out", str(tmp_path / "run"), f"model.pe={value}"])
    assert one_line_error(result, 2).startswith(
        f"error: the plugin PE {value} failed in SlopeLayer.need: ContractError: ScoreBias.score_mod takes a "
        "ScoreMod(fn, args) (tapecli.pe.ScoreMod), got SlopeLayer.pairs: wrap a module-level function")
    with pytest.raises(ValueError, match=r"takes a module-level function as fn, got test_a_score_mod.*<lambda>"):
        ScoreMod(lambda h, q_pos, k_pos: q_pos - k_pos)
    with pytest.raises(ValueError, match="got ScoreBias.checked"):  # a method, even of a class
        ScoreMod(ScoreBias.checked)
    assert ScoreMod(one_line_error).fn is one_line_error  # a module-level function is taken
