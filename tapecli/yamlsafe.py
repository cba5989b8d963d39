"""Reading YAML a user wrote (recipes, `key=value` values, lm-eval task files tape passes on): PyYAML's safe loader,
plus the limits that keep a file from hanging or crashing the reader, and no silently dropped keys.

    data = load(text, "r.yaml")                    # a recipe: TapeError "r.yaml: line 7: ..." on any problem
    data = load(text, origin, tags={"!function"})  # an lm-eval task file: its `!function` tag read as text

Refused, each in one line naming the origin and the line, before anything else happens:
- a key given twice in one mapping (`train: {max_steps: 4, max_steps: 9}`): YAML keeps the last silently, which is
  almost always a mistake in a record of an experiment; merge keys (`<<: *defaults`) still override as YAML says;
- nesting deeper than `MAX_DEPTH` levels (PyYAML composes recursively: 1,000 levels end in a RecursionError);
- aliases that expand to more than `MAX_VALUES` values ("billion laughs": a few lines that expand to 10^9 values
  and hang whatever walks them);
- any tag other than YAML's standard ones and those in `tags` (`!!python/object/apply:os.system` and friends).
Invalid YAML is one line too (`not valid YAML: ...`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from tapecli.errors import TapeError

MAX_DEPTH = 100  # levels of nesting; a recipe needs 4
MAX_VALUES = 100_000  # values after expanding aliases; a recipe holds a few hundred

_MERGE = "tag:yaml.org,2002:merge"


class InvalidYaml(TapeError):
    """The text is not YAML at all (a caller reading command-line values keeps such text as written)."""


class _Refused(Exception):
    """A limit or a rule was broken: (line, what)."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(what)
        self.line, self.what = line, what


class _Loader(yaml.SafeLoader):
    """SafeLoader counting depth as it composes and refusing duplicate keys and unknown tags as it constructs."""

    allowed_tags: frozenset[str] = frozenset()

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _Refused(self.peek_event().start_mark.line + 1,
                               f"nested more than {MAX_DEPTH} levels deep; flatten it")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_document(self) -> Node:
        node = super().compose_document()
        if node is not None:
            size = _expanded_size(node)
            if size > MAX_VALUES:
                raise _Refused(node.start_mark.line + 1,
                               f"its aliases expand to {size:,} values (more than {MAX_VALUES:,}: an alias bomb?); "
                               "write the values out")
        return node

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE:
                continue
            key, line = self.construct_object(key_node, deep=True), key_node.start_mark.line + 1
            try:
                if key in seen:
                    where = f"on line {line}" if seen[key] == line else f"(lines {seen[key]} and {line})"
                    raise _Refused(line, f"key '{key}' is given twice {where}; keep one")
                seen[key] = line
            except TypeError:  # an unhashable key: PyYAML's own error follows
                continue
        return super().construct_mapping(node, deep=deep)

    def construct_undefined(self, node: Node) -> Any:
        if node.tag in self.allowed_tags:
            return self.construct_scalar(node) if isinstance(node, ScalarNode) else None
        raise _Refused(node.start_mark.line + 1, f"the tag {_short_tag(node.tag)} is refused (tape reads plain "
                                                 "YAML values only; nothing in the file is run)")


_Loader.add_constructor(None, _Loader.construct_undefined)  # SafeLoader's table holds its own function


def _short_tag(tag: str) -> str:
    return "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag


def _expanded_size(root: Node) -> int:
    """How many values `root` holds once every alias is expanded (a shared node counted once per use), computed
    once per node, so a bomb is measured without being expanded. A value that holds itself is refused."""
    sizes: dict[int, int] = {}
    stack, entered = [root], set()
    while stack:  # depth-first, post-order, without recursion
        node = stack.pop()
        if id(node) in sizes:
            continue
        children = _children(node)
        if id(node) in entered:
            if any(id(child) not in sizes for child in children):
                raise _Refused(node.start_mark.line + 1, "a value holds itself through an alias; write it out")
            sizes[id(node)] = 1 + sum(sizes[id(child)] for child in children)
            continue
        entered.add(id(node))
        stack.append(node)
        for child in children:
            if id(child) in entered and id(child) not in sizes:
                raise _Refused(child.start_mark.line + 1, "a value holds itself through an alias; write it out")
            stack.append(child)
    return sizes[id(root)]


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def load(text: str, origin: str, tags: Iterable[str] = ()) -> Any:
    """The value the YAML `text` holds; TapeError "<origin>: line N: <problem>" for a refused or invalid document.
    `tags` are local tags to read as plain text (lm-eval's `!function`)."""
    loader = type("Loader", (_Loader,), {"allowed_tags": frozenset(tags)})(text)
    try:
        return loader.get_single_data()
    except _Refused as refused:
        raise TapeError(f"{origin}: line {refused.line}: {refused.what}") from None
    except RecursionError:  # a limit that does not hold on some other path: still one line
        raise TapeError(f"{origin}: nested too deeply to read; flatten it") from None
    except yaml.YAMLError as err:
        problem = " ".join(str(err).split())
        raise InvalidYaml(f"{origin}: not valid YAML: {problem}") from None
    finally:
        loader.dispose()
