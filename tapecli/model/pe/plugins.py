"""PEs from outside the package: installed plugins (entry points), files and modules, and what a model records of
them.

    found = entry_point_plugin("kerple", recorded)        # (class, record) or None: no installed plugin has the name
    cls, record = code_plugin("path/kerple.py:Kerple", recorded)      # also "mypkg.kerple:Kerple"
    installed_plugins()                                   # {name: EntryPoint} of the group `tapecli.pe`

An installed plugin is a package that declares, in its pyproject.toml,

    [project.entry-points."tapecli.pe"]
    kerple = "kerple_pe:Kerple"

so `model.pe=kerple` works as a built-in name does. Files and modules are imported only when this invocation's
command line named them (`tapecli.trust`: the security rule); a file is imported once per content, as a module
named after its hash. Every problem is a ValueError of one line naming the value and the fix.

A record (what a checkpoint's model_config.json keeps in `pe_plugin`) says which code the PE came from:
    {"kind": "entry-point", "name": "kerple", "object": "kerple_pe:Kerple", "package": "kerple-pe", "version": "0.1.0"}
    {"kind": "file", "name": "Kerple", "path": "/abs/kerple.py", "sha256": "..."}
    {"kind": "module", "name": "Kerple", "module": "mypkg.kerple", "package": "mypkg", "version": "1.0",
     "sha256": "..."}
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import sys
from functools import cache
from pathlib import Path
from typing import Any

from tapecli import trust
from tapecli.model.pe.base import PositionalEncoding

ENTRY_POINT_GROUP = "tapecli.pe"
_LOADED: dict[str, tuple[str, str]] = {}  # source file of a plugin imported here -> (what it is, its model.pe value)


def _declared() -> dict[str, list[importlib.metadata.EntryPoint]]:
    """Every entry point of the group `tapecli.pe`, by name, in the order the installed distributions come."""
    found: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, []).append(ep)
    return found


def installed_plugins() -> dict[str, importlib.metadata.EntryPoint]:
    """The entry points of the group `tapecli.pe`, by name. A name that two installed distributions declare is
    refused where it is used (`entry_point_plugin`), naming both."""
    return {name: eps[0] for name, eps in _declared().items()}


def _distribution(ep: importlib.metadata.EntryPoint) -> str:
    return f"{ep.dist.name} {ep.dist.version}" if ep.dist is not None else "a distribution without metadata"


@cache
def _distributions_of(top: str) -> tuple[str, ...]:
    """The installed distributions that provide the top-level module `top`. Reading every installed distribution's
    file list takes about half a second: done once per process and module, not at each model build."""
    return tuple(importlib.metadata.packages_distributions().get(top, []))


def _checked(obj: Any, what: str) -> type[PositionalEncoding]:
    if not (isinstance(obj, type) and issubclass(obj, PositionalEncoding)):
        raise ValueError(f"model.pe: {what} is {obj!r}, not a subclass of tapecli.pe.PositionalEncoding")
    return obj


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def entry_point_plugin(name: str, recorded: dict | None) -> tuple[type[PositionalEncoding], dict] | None:
    """The installed plugin called `name`, or None when no installed package declares it."""
    eps = _declared().get(name)
    if not eps:
        return None
    if len(eps) > 1:
        both = " and ".join(f"{_distribution(ep)} ({ep.value})" for ep in eps)
        raise ValueError(f"model.pe: {len(eps)} installed distributions declare the plugin name {name!r}: {both}; "
                         "uninstall all but one (pip uninstall NAME)")
    ep = eps[0]
    package = ep.dist.name if ep.dist is not None else None
    where = f"plugin {name!r} ({ep.value}{f', package {package}' if package else ''})"
    try:
        obj = ep.load()
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a broken plugin (even one calling sys.exit) is one line
        raise ValueError(f"model.pe: importing {where} failed: {_first_line(e)}") from None
    record = {"kind": "entry-point", "name": name, "object": ep.value, "package": package,
              "version": ep.dist.version if ep.dist is not None else None}
    cls = _checked(obj, where)
    _remember(sys.modules.get(cls.__module__), f"the plugin PE {where}", name)
    return cls, record


def missing_plugin(name: str, builtins: tuple[str, ...], recorded: dict | None) -> str:
    """The one line for a name that is neither built in nor installed: what to install."""
    known = ", ".join(builtins + tuple(installed_plugins()))
    line = (f"model.pe: unknown positional encoding {name!r}; allowed: {known} (built in, or installed plugins: "
            f"packages declaring a {ENTRY_POINT_GROUP} entry point), or FILE.py:CLASS / MODULE:CLASS")
    if recorded and recorded.get("kind") == "entry-point" and recorded.get("package"):
        version = f"=={recorded['version']}" if recorded.get("version") else ""
        line = (f"model.pe: this model's positional encoding {name!r} comes from the plugin package "
                f"{recorded['package']} {recorded.get('version') or ''}, which is not installed: "
                f"pip install '{recorded['package']}{version}'")
    return line


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def code_plugin(value: str, recorded: dict | None) -> tuple[type[PositionalEncoding], dict]:
    """The class a `FILE.py:CLASS` or `MODULE:CLASS` value names, imported only when allowed (tapecli.trust)."""
    target, cls_name = trust.split_code(value)
    if not cls_name.isidentifier():
        raise ValueError(f"model.pe: {value!r} must end in :CLASS, a class name (e.g. kerple.py:Kerple)")
    if trust.is_file_target(target):
        path = _allowed_file(value, target, recorded)
        return _from_file(path, cls_name, value)
    return _from_module(value, target, cls_name, recorded)


def _named_how(value: str, target: str) -> str:
    return (f"allow it with `tape --allow-pe {target} COMMAND ...` (or {trust.ALLOW_ENV}={target}), or name it as "
            f"model.pe={value} / --pe {value} where the command takes those")


def _allowed_file(value: str, target: str, recorded: dict | None) -> Path:
    """The file to import: the path as given, the recorded one, or the one allowed file of that name (a copy of the
    run's plugin elsewhere), whichever this command line named."""
    given = Path(target).expanduser()
    candidates = [given] + ([Path(recorded["path"])] if recorded and recorded.get("kind") == "file" else [])
    named = [c for c in candidates if trust.is_allowed_file(c)]
    for candidate in named:
        if candidate.is_file():
            return candidate.resolve()
    same_name = [p for p in trust.allowed_files() if p.name == given.name and p.is_file()]
    if len(same_name) == 1:
        return same_name[0]
    if named:
        raise ValueError(f"model.pe: {named[0]} (from {value}) is not a file")
    was = ""
    if recorded and recorded.get("kind") == "file":
        was = f" (this model was trained with {recorded.get('path')}, sha256 {str(recorded.get('sha256'))[:12]})"
    raise ValueError(f"model.pe: {value} is code in a file{was}, and tape imports a file only when this "
                     f"invocation's command line names it; {_named_how(value, target)}")


def _import_file(path: Path) -> tuple[Any, str]:
    """(the module, its SHA-256) of an allowed file, imported once per content."""
    digest = sha256(path)
    module_name = f"tapecli_pe_file_{digest[:16]}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ValueError(f"model.pe: {path} cannot be imported as Python")
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # before running it: dataclasses and pickling look modules up by name
        try:
            spec.loader.exec_module(module)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the plugin's own error (sys.exit too), in one line
            del sys.modules[module_name]
            raise ValueError(f"model.pe: importing {path} failed: {_first_line(e)}") from None
    return module, digest


def pe_classes(path: Path) -> list[str]:
    """The PositionalEncoding subclasses a file defines (a file this command line named), in file order."""
    if not trust.is_allowed_file(path):
        raise ValueError(f"model.pe: {path} is not named on this command line")
    if not path.is_file():
        raise ValueError(f"model.pe: {path} is not a file")
    module, _ = _import_file(path.resolve())
    return [name for name, obj in vars(module).items() if isinstance(obj, type) and
            issubclass(obj, PositionalEncoding) and obj.__module__ == module.__name__]


def _from_file(path: Path, cls_name: str, value: str) -> tuple[type[PositionalEncoding], dict]:
    module, digest = _import_file(path)
    if not hasattr(module, cls_name):
        raise ValueError(f"model.pe: {path} defines no {cls_name} (from {value})")
    cls = _checked(getattr(module, cls_name), f"{path}:{cls_name}")
    _remember(module, f"the plugin PE {value}", value)
    return cls, {"kind": "file", "name": cls_name, "path": str(path), "sha256": digest}


def _from_module(value: str, module_name: str, cls_name: str, recorded: dict | None) -> tuple[type, dict]:
    if not trust.is_allowed_module(module_name):
        raise ValueError(f"model.pe: {value} names a module, and tape imports one only when this invocation's "
                         f"command line names it (installed plugins declare an entry point instead); "
                         f"{_named_how(value, module_name)}")
    try:
        module = importlib.import_module(module_name)
    except (Exception, SystemExit) as e:  # noqa: BLE001 - sys.exit at import too
        raise ValueError(f"model.pe: importing {module_name} (from {value}) failed: {_first_line(e)}") from None
    if not hasattr(module, cls_name):
        raise ValueError(f"model.pe: module {module_name} defines no {cls_name}")
    cls = _checked(getattr(module, cls_name), value)
    _remember(module, f"the plugin PE {value}", value)
    top = module_name.split(".")[0]
    packages = _distributions_of(top)
    package = packages[0] if packages else None
    file = getattr(module, "__file__", None)
    return cls, {"kind": "module", "name": cls_name, "module": module_name, "package": package,
                 "version": importlib.metadata.version(package) if package else None,
                 "sha256": sha256(Path(file)) if file and Path(file).is_file() else None}


def _remember(module: Any, what: str, value: str) -> None:
    file = getattr(module, "__file__", None)
    if file:
        _LOADED[str(Path(file).resolve())] = (what, value)


def blame(e: BaseException) -> str | None:
    """One line for an error that a plugin PE's code raised (the innermost frame of the traceback in a plugin's
    file), or a `ContractError` of a plugin's hook (what it returned broke the PE API): it names the plugin and
    the hook; None when no plugin is to blame (the fault boundary's other rules apply)."""
    from tapecli.model.attention.needs import ContractError

    found = None
    tb = e.__traceback__
    while tb is not None:
        where = _LOADED.get(str(Path(tb.tb_frame.f_code.co_filename).resolve()))
        if where is not None:
            found = (where, tb.tb_frame.f_code.co_qualname)
        tb = tb.tb_next
    if found is None and isinstance(e, ContractError):
        code = getattr(e.hook, "__code__", None) or getattr(getattr(e.hook, "__func__", None), "__code__", None)
        where = _LOADED.get(str(Path(code.co_filename).resolve())) if code is not None else None
        if where is not None:
            return (f"{where[0]} broke the PE API: {e}; fix the plugin (`tape --debug ...` shows the traceback) "
                    f"and check it with `tape pe check {where[1]}`")
    if found is None:
        return None
    (what, value), hook = found
    return (f"{what} failed in {hook}: {_first_line(e)}; fix the plugin (`tape --debug ...` shows the traceback) "
            f"and check it with `tape pe check {value}`")


def describe(record: dict[str, Any] | None) -> str:
    """A short phrase saying where a PE's code came from (for notes and `tape pe list`)."""
    if record is None:
        return "built in"
    if record["kind"] == "entry-point":
        return f"package {record.get('package')} {record.get('version') or ''}".rstrip()
    if record["kind"] == "file":
        return f"file {record['path']} (sha256 {record['sha256'][:12]})"
    version = f" {record['package']} {record.get('version')}" if record.get("package") else ""
    return f"module {record['module']}{version}"
