"""Documented commands cannot rot: every command line in README.md and docs/**/*.md goes through the CLI's own
parser (Click's `make_context`, as litgpt's test_readme does with its parser), and nothing is executed.

What counts as a command line (docs/development.md, "These docs", says the same for writers):
- strict: a line in a fenced code block that runs `tape` (also after `$ `, `.venv/bin/`, `time`, `VAR=value`),
  `python -m tapecli[.cli] ...`, `torchrun ... -m tapecli.cli ...`, `bash scripts/demo.sh ...` (= `tape demo ...`)
  or `python -m tapecli.lm_eval_cli ...` (lm-eval's own parser). It must parse completely: unknown commands and options,
  values of the wrong type and missing required options fail. Its `key=value` overrides must load with the
  shipped recipe it names.
- synopsis: a line in a fenced block marked `text`, and an inline code span that runs one of the above. Synopsis
  notation is allowed (`[--out DIR]`, `a|b`, `...`, upper-case or <angle> placeholders) and required options may be
  left out, but every command and option named must exist and typed values must fit.
A line that looks like an invocation but cannot be read (unbalanced quotes, an unknown module) fails as well.

Also checked: `from tapecli... import ...` lines in code blocks import; `tapecli/...`, `tests/...` paths and dotted
`tapecli.` names named anywhere in the docs exist; README.md's relative links reach a file and heading (mkdocs
checks the links inside docs/).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer._click import exceptions as cx  # Typer >= 0.2x parses with its own vendored Click; these are its errors
from typer.core import TyperGroup

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "pending" not in p.parts)]

_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_PLACEHOLDER = re.compile(r"^(<[^>]+>|[A-Z][A-Z0-9_]*)$")
# A line that starts like an invocation of ours; it must then be readable.
_LOOKS_LIKE = re.compile(r"^(\$\s+)?([A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(time\s+)?"
                         r"(\S*/)?(tape\s|tape$|torchrun\s.*-m\s+tapecli|python3?\s+-m\s+tapecli|bash\s+scripts/demo\.sh)")


@dataclass(frozen=True)
class Line:
    """One documented command line: where it is, its text, and whether it must parse completely."""

    where: str
    text: str
    strict: bool

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def extract(markdown: str, name: str = "<text>") -> list[Line]:
    """The command lines of one Markdown text: fenced-block lines (continuations joined, the block's shell variables
    expanded) and inline code spans."""
    found: list[Line] = []
    prose: list[str] = []  # the text outside fences, fenced lines blanked so line numbers stay right
    lines = markdown.splitlines()
    fence, info, i = None, "", 0
    variables: dict[str, str] = {}
    while i < len(lines):
        line = lines[i]
        opening = _FENCE.match(line)
        if fence is None and opening:
            fence, info, variables = opening.group(1), opening.group(2).lower(), {}
            prose.append("")
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            fence = None
            prose.append("")
        elif fence is not None:
            start, text = i, line
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1].rstrip() + " " + lines[i].strip()
                prose.append("")
            prose.append("")
            if re.fullmatch(r"[A-Za-z_]\w*=\S.*", text.strip()):  # NAME="..." alone: what a later $NAME says
                with contextlib.suppress(ValueError):
                    words = shlex.split(text, comments=True)
                    if len(words) == 1:
                        variables.update([words[0].split("=", 1)])
            text = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m, known=variables: known.get(m.group(1), m.group(0)), text)
            if _LOOKS_LIKE.match(text.strip()):
                found.append(Line(f"{name}:{start + 1}", text.strip(), strict=info != "text"))
        else:
            prose.append(line)
        i += 1
    text = "\n".join(prose)
    for span in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, flags=re.S):
        code = " ".join(span.group(2).split())
        if "\n\n" not in span.group(2) and " " in code and _LOOKS_LIKE.match(code):  # not the bare name `tape`
            found.append(Line(f"{name}:{text.count(chr(10), 0, span.start()) + 1}", code, strict=False))
    return found


def documented_lines() -> list[Line]:
    return [line for path in DOCS for line in extract(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))]


# ---------------------------------------------------------------------------------------------------------------
# Parsing


class Unreadable(Exception):
    """A documented line that is not a valid invocation; the message says why."""


def _words(text: str) -> list[str]:
    try:
        words = shlex.split(text, comments=True)
    except ValueError as err:
        raise Unreadable(f"cannot split the line into words ({err})") from None
    if words and words[0] == "$":
        words = words[1:]
    while words and (_ENV.match(words[0]) or words[0] == "time"):
        words = words[1:]
    return words


def _synopsis(words: list[str]) -> list[str]:
    """Synopsis notation to plain words: [--opt X] -> --opt X, a|b -> a, ... dropped."""
    plain = []
    for word in words:
        word = word.strip("[]")
        if not word or word.endswith("..."):
            continue
        if "|" in word and not word.startswith("-"):
            word = word.split("|")[0]
        plain.append(word)
    return plain


def route(line: Line) -> tuple[str, list[str]]:
    """('tape' | 'harness', arguments) for a documented line."""
    words = _words(line.text)
    if not line.strict:
        words = _synopsis(words)
    if not words:
        raise Unreadable("nothing to run")
    program = words[0].rsplit("/", 1)[-1]
    if program == "tape":
        return "tape", words[1:]
    if program == "bash" and words[1:2] == ["scripts/demo.sh"]:
        return "tape", ["demo", *words[2:]]
    if program == "torchrun":
        if "-m" not in words:
            raise Unreadable("torchrun without -m tapecli.cli")
        at = words.index("-m")
        _check_torchrun(words[1:at + 2])
        module, args = words[at + 1], words[at + 2:]
    elif program.startswith("python") and words[1:2] == ["-m"] and len(words) > 2:
        module, args = words[2], words[3:]
    else:
        raise Unreadable(f"not an invocation of tape: {words[0]}")
    if module in ("tapecli", "tapecli.cli"):
        return "tape", args
    if module == "tapecli.lm_eval_cli":
        return "harness", args
    raise Unreadable(f"{module} is not an entry point (tapecli, tapecli.cli, tapecli.lm_eval_cli)")


def _check_torchrun(args: list[str]) -> None:
    from torch.distributed.run import get_args_parser

    _argparse(get_args_parser(), [*args, "--"], "torchrun")


def _argparse(parser, args: list[str], what: str) -> None:
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exit_:
            if exit_.code:
                raise Unreadable(f"{what} rejects it: {err.getvalue().strip().splitlines()[-1]}") from None


def _rest(ctx) -> list[str]:
    """What a group left for its sub-command (Click keeps the sub-command's name apart)."""
    return [*ctx._protected_args, *ctx.args]


def parse_tape(args: list[str], strict: bool):
    """Parse `tape ARGS` down to the leaf command; its context, or None when the line stops early (help, a group
    without a command, a placeholder command). Raises a Click UsageError (or Unreadable) when the line is wrong."""
    from cli_helpers import command_tree

    from tapecli.cli import app

    command = command_tree(app)
    name, parent = "tape", None
    while True:
        for _ in range(len(args) + 1):  # synopsis: a placeholder value (`--samples N`) becomes `1`, then retried
            try:
                ctx = command.make_context(name, list(args), parent=parent)
                break
            except typer.Exit:
                return None  # --help
            except cx.NoArgsIsHelpError:
                return None  # `tape` or `tape eval` alone: shows the help
            except cx.MissingParameter:
                if strict:
                    raise
                return None
            except cx.BadParameter as err:
                spot = _placeholder_spot(args, err.param) if not strict else None
                if spot is None:
                    raise
                args = [*args[:spot], "1", *args[spot + 1:]]
        else:
            raise Unreadable("too many placeholder values")
        if not isinstance(command, TyperGroup):
            return ctx
        rest = _rest(ctx)
        if not rest:
            return None
        if not strict and _PLACEHOLDER.match(rest[0]):
            return None
        name, command, args = command.resolve_command(ctx, rest)
        parent = ctx


def _placeholder_spot(args: list[str], param) -> int | None:
    if param is None:
        return None
    for at, word in enumerate(args[:-1]):
        if word in param.opts and _PLACEHOLDER.match(args[at + 1]):
            return at + 1
    return None


def _check_recipe(ctx) -> None:
    """A strict line's `key=value` overrides must load with the shipped recipe it names."""
    from tapecli.errors import TapeError
    from tapecli.recipe import list_recipes, load_recipe

    recipe, overrides = ctx.params.get("recipe"), ctx.params.get("overrides")
    if recipe is None or recipe.removesuffix(".yaml") not in {name for name, _ in list_recipes()}:
        return  # a user's own file (r.yaml): only the parser can check the line
    try:
        load_recipe(recipe, list(overrides or []))
    except TapeError as err:
        raise Unreadable(f"recipe {recipe}: {err}") from None


# Pages whose commands run for real, in order, with the files and packages the page has the reader make
# (tests/test_tutorial.py): their lines are parsed here, and their overrides loaded there.
EXECUTED_PAGES = ("docs/write-your-own-pe.md",)


def check(line: Line) -> None:
    """Raise (a Click UsageError or Unreadable) if the documented line would not parse."""
    program, args = route(line)
    if program == "harness":
        from lm_eval._cli import HarnessCLI

        cli = HarnessCLI()  # what `python -m tapecli.lm_eval_cli` runs; its argparse parser has no public name
        _argparse(cli._parser, args if args[:1] in (["run"], ["ls"], ["validate"]) else ["run", *args], "lm-eval")
        return
    ctx = parse_tape(args, line.strict)
    if ctx is not None and line.strict and not line.where.startswith(EXECUTED_PAGES):
        _check_recipe(ctx)


# ---------------------------------------------------------------------------------------------------------------
# The documented lines

LINES = documented_lines()


def test_the_docs_hold_command_lines_of_every_kind() -> None:
    """The extraction finds what the docs hold (a broken extractor must not pass by finding nothing)."""
    assert len(LINES) > 80
    texts = [line.text for line in LINES]
    assert sum(line.strict for line in LINES) > 40
    for start in ("torchrun ", "python -m tapecli.lm_eval_cli ", "bash scripts/demo.sh", "$ tape ", "OMP_NUM_THREADS="):
        assert any(t.startswith(start) for t in texts), start
    assert {f"tape {c}" for c in ("pretrain", "finetune", "extend-context", "export", "demo", "bench", "recipes")} <= {
        " ".join(t.split()[:2]) for t in texts}
    assert {c for t in texts if t.startswith("tape eval ") for c in [t.split()[2]]} >= {
        "addition", "perplexity", "passkey", "scrolls", "harness", "synthetic"}


@pytest.mark.parametrize("line", LINES, ids=lambda line: line.where)
def test_documented_command_parses(line: Line) -> None:
    try:
        check(line)
    except (cx.UsageError, Unreadable) as err:
        message = err.format_message() if isinstance(err, cx.UsageError) else str(err)
        pytest.fail(f"{line}\n  -> {message}", pytrace=False)


# ---------------------------------------------------------------------------------------------------------------
# The checker itself catches what it should

_MADE_UP = """
Some prose with `tape eval addition --model RUN [--max-len 80] [--samples N]` and `tensorboard --logdir x`.

```bash
tape pretrain --recipe c4-smoke --out runs/x \\
    model.pe=alibi   # a comment
python -m pytest -q
```

```text
tape extend-context --base DIR --method tape|lora [--out DIR] [key=value ...]
resume with: tape pretrain --recipe r.yaml
```
"""


def test_extract_reads_fences_continuations_comments_synopses_and_inline_spans() -> None:
    found = extract(_MADE_UP, "made-up.md")
    assert [(line.where, line.strict) for line in found] == [
        ("made-up.md:5", True), ("made-up.md:11", False), ("made-up.md:2", False)]
    assert found[0].text == "tape pretrain --recipe c4-smoke --out runs/x model.pe=alibi   # a comment"
    for line in found:
        check(line)


def test_a_blocks_shell_variables_are_expanded() -> None:
    block = '```bash\nO="--samples 5 --max-len 80"\ntape eval addition --model runs/x $O\nO="--max-len eighty"\n' \
            'tape eval addition --model runs/x ${O}\n```\n'
    good, bad = extract(block, "made-up.md")
    assert good.text == "tape eval addition --model runs/x --samples 5 --max-len 80"
    check(good)
    with pytest.raises(cx.BadParameter):
        check(bad)


@pytest.mark.parametrize("text, error", [
    ("tape pretrain --recipe c4-smoke --out runs/x --no-such-option 3", cx.NoSuchOption),
    ("tape eval addition --model runs/x --max-len eighty", cx.BadParameter),
    ("tape pretrain --out runs/x", cx.MissingParameter),
    ("tape eval nosuch --model runs/x", cx.UsageError),
    ("tape pretrain --recipe c4-smoke --out runs/x model.nosuch=1", Unreadable),
    ("tape pretrain --recipe c4-smoke --out runs/x model.pe=nosuch", Unreadable),
    ("torchrun --nproc_per_node 2 -m tapecli.cli pretrain --recipe c4-smoke --out r --bogus", cx.NoSuchOption),
    ("torchrun --no-such-torchrun-flag 2 -m tapecli.cli pretrain --recipe c4-smoke --out r", Unreadable),
    ("python -m tapecli.nosuch pretrain", Unreadable),
    ("python -m tapecli.lm_eval_cli --model tape --no_such_flag 1", Unreadable),
    ("bash scripts/demo.sh --seed two", cx.BadParameter),
    ('tape pretrain --recipe "c4-smoke --out runs/x', Unreadable),
])
def test_a_wrong_line_fails(text: str, error: type[Exception]) -> None:
    with pytest.raises(error):
        check(Line("made-up.md:1", text, strict=True))


def test_synopsis_lines_may_leave_out_required_options_but_not_invent_any() -> None:
    check(Line("s", "tape finetune --checkpoint RUN_OR_CHECKPOINT", strict=False))
    check(Line("s", "tape --debug <command> ...", strict=False))
    check(Line("s", "tape bench --decode --rounds N", strict=False))
    with pytest.raises(cx.NoSuchOption):
        check(Line("s", "tape finetune --checkpoint RUN [--no-such DIR]", strict=False))
    with pytest.raises(cx.BadParameter):
        check(Line("s", "tape bench --rounds three", strict=False))


# ---------------------------------------------------------------------------------------------------------------
# Names, paths and links the docs mention

_TEXTS = {str(path.relative_to(ROOT)): path.read_text(encoding="utf-8") for path in DOCS}


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for part in parts[cut:]:
            if not hasattr(found, part):
                return False
            found = getattr(found, part)
        return True
    return False


def test_named_modules_paths_and_imports_exist() -> None:
    missing = []
    for name, text in _TEXTS.items():
        for dotted in set(re.findall(r"\btapecli(?:\.[A-Za-z_][A-Za-z0-9_]*)+", text)):
            if not dotted.endswith("__main__") and not _resolves(dotted):
                missing.append(f"{name}: {dotted}")
        for path in set(re.findall(r"(?<![\w./-])((?:tapecli|tests|scripts)/[\w./-]*)", text)):
            if not (ROOT / path.rstrip(".")).exists():
                missing.append(f"{name}: {path}")
        for module, names in re.findall(r"^\s*from (tapecli[\w.]*) import ([\w, ]+?)\s*(?:#.*)?$", text, flags=re.M):
            imported = [n.split()[0] for n in names.split(",") if n.strip()]  # `a as b` imports a
            missing += [f"{name}: from {module} import {n}" for n in imported if not _resolves(f"{module}.{n}")]
    assert not missing, "the docs name what does not exist:\n" + "\n".join(sorted(missing))


def _anchors(path: Path) -> set[str]:
    import markdown

    md = markdown.Markdown(extensions=["toc", "tables", "fenced_code"])
    md.convert(path.read_text(encoding="utf-8"))

    def walk(tokens: list[dict]) -> set[str]:
        return {t["id"] for t in tokens} | {i for t in tokens for i in walk(t["children"])}

    return walk(md.toc_tokens)


def test_readme_links_reach_their_page_and_heading() -> None:
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _TEXTS["README.md"]):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = ROOT / file if file else ROOT / "README.md"
        if not path.exists():
            broken.append(f"{target}: no such file")
        elif anchor and anchor not in _anchors(path):
            broken.append(f"{target}: no heading #{anchor}")
    assert not broken, "README.md links:\n" + "\n".join(broken)


# ---------------------------------------------------------------------------------------------------------------
# The docs speak to users about the project, not about how the work on it was organised

# Wording about who worked on tape and how ("no GPU was lent to this work", "killed at the end of working sessions"):
# the docs say what was measured on which hardware instead ("measured on a 2-core CPU").
_ABOUT_THE_WORK = re.compile(r"\blent\b|\bsessions?\b|\bthis (?:work|task)\b|\bno GPU (?:was|is) (?:available|lent)"
                             r"|\bthe lead\b", re.IGNORECASE)


def _prose(markdown: str) -> list[tuple[int, str]]:
    """(line number, text) of every line outside fenced blocks, its code spans removed."""
    found, fenced = [], False
    for number, line in enumerate(markdown.splitlines(), 1):
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            found.append((number, re.sub(r"`[^`]*`", "", line)))
    return found


def test_the_docs_speak_of_the_project_only() -> None:
    texts = {**_TEXTS, "CHANGELOG.md": (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")}
    found = [f"{name}:{number}: {line.strip()}" for name, text in texts.items() for number, line in _prose(text)
             if _ABOUT_THE_WORK.search(line)]
    assert not found, "say what was measured on which hardware instead:\n" + "\n".join(found)


def test_the_wording_check_catches_what_it_should() -> None:
    made_up = ("A table.\nNo GPU was lent to this work.\n```text\nseconds this session\n```\n"
               "Killed at the end of sessions.\n")
    assert [n for n, line in _prose(made_up) if _ABOUT_THE_WORK.search(line)] == [2, 6]
    assert not _ABOUT_THE_WORK.search(re.sub(r"`[^`]*`", "", "`seconds_this_session` is in results.json"))


if __name__ == "__main__":  # `python tests/test_docs.py`: list what is checked
    for documented in LINES:
        print(("strict   " if documented.strict else "synopsis ") + str(documented))
    sys.exit(0)
