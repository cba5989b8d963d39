"""Plugin PEs: one function resolves every `model.pe` value (built-in, installed entry point, file, module); code
from outside installed packages is imported only when the command line named it; what a model records of its
plugin; one-line errors."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from plugin_helpers import MODULE, NAME, PACKAGE, VERSION, install_plugin, write_plugin

from tapecli import trust
from tapecli.model import PE_NAMES, ModelConfig, Transformer
from tapecli.model.pe import resolve_pe
from tapecli.model.pe.plugins import describe

SIZE = dict(vocab_size=31, dim=32, n_layers=2, n_heads=4, max_seq_len=32)


@pytest.fixture(autouse=True)
def nothing_allowed(monkeypatch):
    """Each test starts with nothing named (TAPE_ALLOW_PE unset), and leaves it as it was."""
    monkeypatch.delenv(trust.ALLOW_ENV, raising=False)


def test_built_ins_resolve_to_themselves_and_record_nothing():
    for name in PE_NAMES:
        resolved = resolve_pe(name)
        assert (resolved.name, resolved.record) == (name, None)
    config = ModelConfig(**SIZE, pe="alibi")
    assert "pe_plugin" not in config.to_dict()  # a built-in's model_config.json reads as it always has
    assert ModelConfig.from_dict(config.to_dict()) == config


def test_a_file_is_imported_only_when_named_and_its_content_is_recorded(tmp_path, monkeypatch):
    for name in [n for n in sys.modules if n.startswith("tapecli_pe_file_")]:  # a file is imported once per content:
        monkeypatch.delitem(sys.modules, name)  # an earlier test's import of the same plugin would leave no marker
    path = write_plugin(tmp_path)
    marker = path.with_suffix(".imported")
    value = f"{path}:LearnedALiBi"
    with pytest.raises(ValueError, match=r"is code in a file.*--allow-pe") as refused:
        ModelConfig(**SIZE, pe=value)
    assert "\n" not in str(refused.value) and not marker.exists()  # one line, and the file never ran
    trust.allow_named([f"model.pe={value}", "train.lr=1e-3"])  # what `tape pretrain ... model.pe=FILE:CLASS` does
    config = ModelConfig(**SIZE, pe=value, pe_args={"init": 0.5})
    assert marker.exists()
    record = config.to_dict()["pe_plugin"]
    assert record["kind"] == "file" and record["name"] == "LearnedALiBi" and record["path"] == str(path.resolve())
    assert len(record["sha256"]) == 64 and describe(record).startswith(f"file {path.resolve()} (sha256 ")
    model = Transformer(config)
    assert [n for n, _ in model.named_parameters() if ".pe." in n] == ["model.layers.0.pe.slopes",
                                                                      "model.layers.1.pe.slopes"]
    assert model.model.layers[0].pe.slopes.tolist() == [0.25] * 4  # init_weights ran after the generic init
    assert ModelConfig.from_dict(json.loads(json.dumps(config.to_dict()))).pe_plugin == record


def test_a_recorded_file_path_is_not_a_permission_but_a_named_copy_is_used(tmp_path, monkeypatch):
    original = write_plugin(tmp_path / "there")
    trust.allow(str(original))
    saved = ModelConfig(**SIZE, pe=f"{original}:LearnedALiBi").to_dict()
    shutil.rmtree(tmp_path / "there")  # the run is opened elsewhere: the recorded file is gone
    copy = write_plugin(tmp_path / "here")
    with pytest.raises(ValueError, match="there/learned_alibi.py .* is not a file"):
        ModelConfig.from_dict(saved)  # TAPE_ALLOW_PE still names the old path only
    monkeypatch.delenv(trust.ALLOW_ENV)
    with pytest.raises(ValueError, match="trained with .*there/learned_alibi.py, sha256"):
        ModelConfig.from_dict(saved)  # nothing named: the recorded path alone allows nothing
    trust.allow(str(copy))  # `tape --allow-pe here/learned_alibi.py ...`
    reopened = ModelConfig.from_dict(saved)
    assert reopened.pe_plugin["path"] == str(copy.resolve()) and reopened.pe == saved["pe"]


def test_a_module_is_imported_only_when_named(tmp_path, monkeypatch):
    package = tmp_path / "mypes"
    write_plugin(package, "slopes.py")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match="names a module, and tape imports one only when"):
        resolve_pe("mypes.slopes:LearnedALiBi")
    assert "mypes.slopes" not in sys.modules and not (package / "slopes.imported").exists()
    trust.allow("mypes.slopes:LearnedALiBi")
    try:
        resolved = resolve_pe("mypes.slopes:LearnedALiBi")
        assert resolved.name == "LearnedALiBi" and resolved.record["module"] == "mypes.slopes"
        assert resolved.record["package"] is None and len(resolved.record["sha256"]) == 64
    finally:
        for name in ("mypes", "mypes.slopes"):
            sys.modules.pop(name, None)


def test_an_installed_plugin_is_a_name_and_a_missing_one_names_its_package(plugin_site, monkeypatch):
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(plugin_site))
        config = ModelConfig(**SIZE, pe=NAME)  # no naming needed: installing it was the user's choice
        assert config.pe_plugin == {"kind": "entry-point", "name": NAME, "object": f"{MODULE}:LearnedALiBi",
                                    "package": PACKAGE, "version": VERSION}
        saved = config.to_dict()
    sys.modules.pop(MODULE, None)
    with pytest.raises(ValueError) as missing:
        ModelConfig.from_dict(saved)
    assert str(missing.value) == (f"model.pe: this model's positional encoding '{NAME}' comes from the plugin package "
                                  f"{PACKAGE} {VERSION}, which is not installed: pip install '{PACKAGE}=={VERSION}'")
    with pytest.raises(ValueError, match=r"unknown positional encoding 'learned-alibi'; allowed: nope, rope"):
        ModelConfig(**SIZE, pe=NAME)


@pytest.mark.parametrize("source, error", [
    ("LearnedALiBi = 3\n", "is 3, not a subclass of tapecli.pe.PositionalEncoding"),
    ("x = 1\n", "defines no LearnedALiBi"),
    ("raise RuntimeError('no GPU here')\n", "failed: RuntimeError: no GPU here"),
    ("import sys\nsys.exit(3)\n", "failed: SystemExit: 3"),  # would end tape silently
])
def test_bad_plugin_code_is_one_line(tmp_path, source, error):
    path = tmp_path / "bad.py"
    path.write_text(source)
    trust.allow(str(path))
    with pytest.raises(ValueError, match=error) as raised:
        resolve_pe(f"{path}:LearnedALiBi")
    assert "\n" not in str(raised.value)


def test_pe_args_of_a_plugin_are_checked_like_a_built_in(tmp_path):
    path = write_plugin(tmp_path)
    trust.allow(str(path))
    with pytest.raises(ValueError, match=r"model.pe_args.theta: not an argument of pe .*; allowed: init"):
        ModelConfig(**SIZE, pe=f"{path}:LearnedALiBi", pe_args={"theta": 1.0})
    assert ModelConfig(**SIZE, pe=f"{path}:LearnedALiBi", pe_args={"init": 1}).pe_args == {"init": 1}


def test_a_plugin_pe_trains_like_a_built_in(tmp_path):
    path = write_plugin(tmp_path)
    trust.allow(str(path))
    torch.manual_seed(0)
    model = Transformer(ModelConfig(**SIZE, pe=f"{path}:LearnedALiBi"))
    x = torch.randint(0, 31, (2, 12), generator=torch.Generator().manual_seed(0))
    model(x).float().pow(2).mean().backward()
    assert model.model.layers[0].pe.slopes.grad.abs().sum() > 0


def test_allow_named_takes_model_pe_overrides_and_pe_list_items_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    trust.allow_named(["model.pe='a.py:A'", "train.lr=1e-3", "rope", "pkg.mod:B", "model.pe_args.x=c.py:C",
                       "rope:hope=true", "d.py:D:init=0.5", "model.schedule.kinds.global.pe=e.py:E",
                       "model.schedule.kinds.g.pe_args.x=f.py:F"])
    assert trust.allowed_files() == [tmp_path / "a.py", tmp_path / "d.py", tmp_path / "e.py"]  # a layer's PE too
    assert trust.is_allowed_module("pkg.mod") and not trust.is_allowed_file(tmp_path / "c.py")
    assert not trust.is_allowed_module("rope")  # name:key=value is a --pe spec's pe_args, not code


def test_built_in_pes_use_only_the_public_api():
    """Every built-in PE file imports tape only through `tapecli.model.pe.base` (what `tapecli.pe` publishes) or a
    sibling PE file, so the public API is proven by every built-in; the API itself (base.py) and the package's
    plumbing (the registry and plugin loading) are exempt."""
    import ast

    import tapecli.model.pe as package

    plumbing = {"__init__.py", "registry.py", "plugins.py", "base.py"}  # base.py: the API itself
    folder = Path(package.__file__).parent
    siblings = {f"tapecli.model.pe.{p.stem}" for p in folder.glob("*.py")}
    for path in sorted(folder.glob("*.py")):
        if path.name in plumbing:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("tapecli"):
                    assert name in siblings - {"tapecli.model.pe.registry", "tapecli.model.pe.plugins"}, \
                        f"{path.name} imports {name}"


def test_a_module_plugin_scans_the_installed_distributions_once_not_at_each_resolution(tmp_path, monkeypatch):
    """Each scan of the installed distributions' metadata takes about half a second; `tape pe check` resolves a PE
    89 times. A module resolves with at most twice the file form's scans (which is none): once per process."""
    import importlib.metadata

    from tapecli.model.pe import plugins

    package = tmp_path / "scanpes"
    write_plugin(package, "slopes.py")
    (package / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    file = write_plugin(tmp_path / "file")
    scans = []
    real = importlib.metadata.distributions
    monkeypatch.setattr(importlib.metadata, "distributions", lambda *a, **k: scans.append(1) or real(*a, **k))
    plugins._distributions_of.cache_clear()
    counted = {}
    try:
        for value in (f"{file}:LearnedALiBi", "scanpes.slopes:LearnedALiBi"):
            trust.allow(value)
            scans.clear()
            for _ in range(5):
                Transformer(ModelConfig(**SIZE, pe=value))
            counted[value] = len(scans)
    finally:
        for name in ("scanpes", "scanpes.slopes"):
            sys.modules.pop(name, None)
    file_scans, module_scans = counted.values()
    assert file_scans == 0 and module_scans <= max(1, 2 * file_scans), counted


def test_two_distributions_declaring_one_plugin_name_are_refused_naming_both(plugin_site, tmp_path, monkeypatch):
    other = install_plugin(tmp_path, package="other-alibi")
    monkeypatch.syspath_prepend(str(plugin_site))
    monkeypatch.syspath_prepend(str(other))
    with pytest.raises(ValueError) as clash:
        resolve_pe(NAME)
    assert str(clash.value) == (f"model.pe: 2 installed distributions declare the plugin name '{NAME}': "
                                f"other-alibi {VERSION} ({MODULE}:LearnedALiBi) and {PACKAGE} {VERSION} "
                                f"({MODULE}:LearnedALiBi); uninstall all but one (pip uninstall NAME)")
    assert MODULE not in sys.modules  # refused before either was imported
