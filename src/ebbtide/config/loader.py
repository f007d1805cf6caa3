"""Reading a YAML config file without surprises, and placing errors in it.

PyYAML alone lets the last of two equal keys win silently, recurses once per level of
nesting (5,000 levels are a ``RecursionError``), expands aliases without limit and lets
``ValueError`` escape for values it cannot build (``2026-02-30``, a 5,000-digit integer).
:func:`read_yaml` refuses each of these with a :class:`~ebbtide.errors.ConfigError` that
names the file, the line and column, and the field path:

- a file that is not a regular file, or longer than :data:`MAX_FILE_BYTES`, or not UTF-8;
- nesting deeper than :data:`MAX_DEPTH` levels;
- more than :data:`MAX_VALUES` values, counting each value an alias repeats, and an alias
  inside its own anchor;
- a key given twice in one mapping.

A key given twice does not stop the reading: :func:`read_yaml` builds the value (the
last one counts) and keeps the duplicate beside it, so that the caller validating the
value reports it with every other error of the file in one run
(:meth:`YamlDocument.report`).  Nor does a scalar YAML cannot build (``2026-02-30``):
it is read as its text and kept beside the value the same way.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import yaml
from yaml.error import Mark

from ebbtide.errors import ConfigError

#: Largest config file, in bytes (1 MiB: a policy is a few KiB).
MAX_FILE_BYTES = 1024 * 1024
#: Deepest nesting of mappings and lists (a policy needs four levels).
MAX_DEPTH = 32
#: Most values (mappings, lists and scalars, with what aliases repeat) in one file.
MAX_VALUES = 100_000
#: Longest integer, in characters: far past every bound a config number has.
MAX_INT_CHARS = 64
#: Most problems listed in one error; the rest are counted.
MAX_REPORTED = 50

Loc = tuple[str | int, ...]
_MERGE_TAG = "tag:yaml.org,2002:merge"


class _Problem(Exception):
    """Something wrong at a place in the file, found while loading."""

    def __init__(self, loc: Loc, mark: Mark | None, message: str) -> None:
        super().__init__(message)
        self.loc, self.mark, self.message = loc, mark, message


class _Duplicate(_Problem):
    """A key given twice: reported, but the value can still be built and checked."""


def read_config(path: str | os.PathLike[str], what: str = "config file") -> str:
    """The text of a config file: a regular UTF-8 file of at most :data:`MAX_FILE_BYTES`,
    looked at (``os.stat``) before a byte is read."""
    name = os.fspath(path)

    def check(info: os.stat_result) -> None:
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(
                f"{name}: the {what} is a directory, not a regular file; name the file"
            )
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{name}: the {what} is not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(
                f"{name}: the {what} is {info.st_size} bytes; at most {MAX_FILE_BYTES} (1 MiB)"
            )

    try:
        check(os.stat(path))
        # non-blocking: should the path turn into a pipe after the stat, open still returns
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        with open(fd, "rb") as f:
            check(os.fstat(f.fileno()))
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{name}: cannot read the {what}: {exc.strerror}") from None
    except ValueError:  # a NUL byte in the path
        raise ConfigError(f"{name!r}: cannot read the {what}: not a valid path") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"{name}: the {what} is over {MAX_FILE_BYTES} bytes (1 MiB)")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        col = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(f"{name}:{line}:{col}: (top): the {what} is not UTF-8 text") from None


class _Loader(yaml.SafeLoader):
    """A safe loader that bounds nesting and turns construction failures into problems."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._path: list[str | int] = []
        #: where each node was first met, for problems found while building values
        self.paths: dict[int, Loc] = {}
        #: the scalars that could not be built (read as their text instead)
        self.unbuilt: list[_Problem] = []

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if isinstance(index, yaml.ScalarNode):
            part: str | int = str(index.value)
        else:
            part = index if isinstance(index, int) else "(key)"
        self._path.append(part)
        try:
            if len(self._path) > MAX_DEPTH + 1:
                raise _Problem(
                    tuple(self._path[1:]),
                    self.peek_event().start_mark,
                    f"nested deeper than {MAX_DEPTH} levels",
                )
            return super().compose_node(parent, index)
        finally:
            self._path.pop()

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError, TypeError) as exc:
            shown = str(node.value) if isinstance(node, yaml.ScalarNode) else node.tag
            shown = shown if len(shown) <= 30 else shown[:30] + "…"
            problem = _Problem(
                self.paths.get(id(node), ()), node.start_mark, f"cannot read {shown!r}: {exc}"
            )
            if not isinstance(node, yaml.ScalarNode):
                raise problem from None
            # a scalar: noted, and read as its text, so the rest of the file is still read
            # and checked (the caller drops what validation says of the text)
            self.unbuilt.append(problem)
            self.recursive_objects.pop(node, None)
            self.constructed_objects[node] = str(node.value)
            return str(node.value)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        text = str(node.value)
        if len(text) > MAX_INT_CHARS:
            raise ValueError(f"a number of {len(text)} characters is past every limit")
        return super().construct_yaml_int(node)


_Loader.add_constructor("tag:yaml.org,2002:int", _Loader.construct_yaml_int)


@dataclass(frozen=True)
class YamlDocument:
    """A YAML file read: its node tree (for error positions), its value, and the keys it
    gives twice (the last one counts in ``data``)."""

    filename: str
    node: yaml.Node | None
    data: Any
    duplicates: tuple[_Problem, ...] = ()
    #: values YAML could not build (``2026-02-30``): in ``data`` as their text
    unbuilt: tuple[_Problem, ...] = ()

    @property
    def failed(self) -> bool:
        """Whether reading found a problem already (a duplicate key, a value unbuilt)."""
        return bool(self.duplicates or self.unbuilt)

    def unbuilt_at(self, loc: Sequence[Any]) -> bool:
        """Whether ``loc`` is (or lies inside) a value YAML could not build: what
        validation says there is about its text, not what the file meant."""
        parts = [str(p) for p in loc]
        return any(parts[: len(p.loc)] == [str(x) for x in p.loc] for p in self.unbuilt)

    def report(self, problems: Sequence[tuple[Sequence[Any], str]] = ()) -> str:
        """``file:line:col: path: message`` for each duplicate key, each value
        unbuilt and each of ``problems`` (``(path, message)``, placed in the node tree),
        in file order; empty when none."""
        placed = [*self.duplicates, *self.unbuilt, *_placed(problems, self.node, self.filename)]
        return _lines(placed, self.filename) if placed else ""


def read_yaml(text: str, filename: str) -> YamlDocument:
    """Parse ``text`` (the file ``filename``): its node tree, its value and the keys it
    gives twice, which the caller reports with the other errors it finds (it must: the
    last one counts in the value).  Raises :class:`ConfigError` for the rest of the
    module doc's list, with the duplicates found before."""
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_FILE_BYTES:
        raise ConfigError(f"{filename}:1:1: (top): {size} bytes; at most {MAX_FILE_BYTES} (1 MiB)")
    loader = None
    duplicates: list[_Problem] = []
    try:
        loader = _Loader(text)  # the reader checks every character here
        node = loader.get_single_node()
        if node is None:
            return YamlDocument(filename, None, None)
        problems = _walk(node, loader.paths)
        if any(not isinstance(p, _Duplicate) for p in problems):
            raise ConfigError(_lines(problems, filename))
        duplicates = problems
        try:
            data = loader.construct_document(node)
        except (ValueError, OverflowError, TypeError) as exc:  # outside any one node
            raise _Problem((), node.start_mark, f"cannot read the file: {exc}") from None
        return YamlDocument(filename, node, data, tuple(duplicates), tuple(loader.unbuilt))
    except _Problem as p:
        unbuilt = loader.unbuilt if loader is not None else []
        raise ConfigError(_lines([*duplicates, *unbuilt, p], filename)) from None
    except yaml.YAMLError as exc:
        raise ConfigError(_syntax_error(exc, text, filename)) from None
    finally:
        if loader is not None:
            loader.dispose()


def _syntax_error(exc: yaml.YAMLError, text: str, filename: str) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    context, first = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and first and "duplicate anchor" in context:  # problem: "second occurrence"
        problem = f"{context.split(';')[0]} (first on line {first.line + 1})"
    if mark is not None:
        where = f"{filename}:{mark.line + 1}:{mark.column + 1}"
    elif isinstance(exc, yaml.reader.ReaderError):  # a character YAML does not allow
        pos = min(exc.position, len(text))
        line = text.count("\n", 0, pos) + 1
        where = f"{filename}:{line}:{pos - (text.rfind(chr(10), 0, pos) + 1) + 1}"
        problem = f"the character #x{exc.character:04X} is not allowed in YAML"
    else:
        where = f"{filename}:1:1"
    return f"{where}: YAML syntax error: {problem}"


def _children(node: yaml.Node) -> list[tuple[str | int, yaml.Node]]:
    if isinstance(node, yaml.MappingNode):
        out: list[tuple[str | int, yaml.Node]] = []
        for k, v in node.value:
            name = str(k.value) if isinstance(k, yaml.ScalarNode) else "(key)"
            out += [("(key)", k), (name, v)]
        return out
    if isinstance(node, yaml.SequenceNode):
        return list(enumerate(node.value))
    return []


def _duplicates(node: yaml.MappingNode, loc: Loc) -> list[_Problem]:
    problems: list[_Problem] = []
    first: dict[tuple[str, str], int] = {}
    for key, _value in node.value:
        if not isinstance(key, yaml.ScalarNode) or key.tag == _MERGE_TAG:
            continue
        ident = (key.tag, str(key.value))
        if ident in first:
            problems.append(
                _Duplicate(
                    (*loc, str(key.value)),
                    key.start_mark,
                    f"duplicate key (first given on line {first[ident]}); give each key once",
                )
            )
        else:
            first[ident] = key.start_mark.line + 1
    return problems


def _walk(root: yaml.Node, paths: dict[int, Loc]) -> list[_Problem]:
    """Duplicate keys, alias cycles, and the size and depth with aliases expanded.

    Iterative (aliases can chain far deeper than the text nests): a post-order walk that
    visits each node once, recording where it was first met in ``paths``."""
    problems: list[_Problem] = []
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, Loc, bool]] = [(root, (), False)]
    while stack:
        node, loc, leaving = stack.pop()
        key = id(node)
        kids = _children(node)
        if leaving:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(k)] for _, k in kids)
            depth[key] = 1 + max((depth[id(k)] for _, k in kids), default=0)
            if size[key] > MAX_VALUES:
                return [_Problem(loc, node.start_mark, f"more than {MAX_VALUES} values")]
            if depth[key] > MAX_DEPTH + 1:
                return [_Problem(loc, node.start_mark, f"nested deeper than {MAX_DEPTH} levels")]
            continue
        if key in size:
            continue
        paths.setdefault(key, loc)
        open_nodes.add(key)
        stack.append((node, loc, True))
        if isinstance(node, yaml.MappingNode):
            problems += _duplicates(node, loc)
        for part, kid in kids:
            if id(kid) in open_nodes:
                return [_Problem((*loc, part), kid.start_mark, "an alias inside its own anchor")]
            if id(kid) not in size:
                stack.append((kid, (*loc, part), False))
    return problems


def _lines(problems: Sequence[_Problem], filename: str) -> str:
    """One ``file:line:col: path: message`` line per problem, in file order (by line, then
    column; those with no position last, as given), whoever found each."""
    problems = sorted(
        problems, key=lambda p: (0, p.mark.line, p.mark.column) if p.mark else (1, 0, 0)
    )
    out = []
    for p in problems[:MAX_REPORTED]:
        line, col = (p.mark.line + 1, p.mark.column + 1) if p.mark else (1, 1)
        out.append(f"{filename}:{line}:{col}: {_dotted(p.loc)}: {p.message}")
    if len(problems) > MAX_REPORTED:
        out.append(f"{filename}: and {len(problems) - MAX_REPORTED} more problems")
    return "\n".join(out)


def _dotted(loc: Sequence[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(top)"


def _placed(
    problems: Sequence[tuple[Sequence[Any], str]], node: yaml.Node | None, filename: str
) -> list[_Problem]:
    placed = [_Problem(tuple(loc), None, msg) for loc, msg in problems]
    for p, (loc, _) in zip(placed, problems, strict=True):
        line, col = position(node, [str(part) for part in loc])
        p.mark = Mark(filename, 0, line - 1, col - 1, "", 0)
    return placed


def position(node: yaml.Node | None, loc: list[str]) -> tuple[int, int]:
    """Line and column (1-based) of the YAML node at ``loc``, as deep as it goes (of a key
    given twice, the last one: its value is the one that counts)."""
    best = node
    for key in loc:
        if isinstance(best, yaml.MappingNode):
            nxt = None
            for k, v in reversed(best.value):
                if str(k.value) == key:
                    nxt = v if key != loc[-1] else k
                    break
            if nxt is None:
                break
            best = nxt
        elif isinstance(best, yaml.SequenceNode) and key.isdigit() and int(key) < len(best.value):
            best = best.value[int(key)]
        else:
            break
    if best is None:
        return 1, 1
    return best.start_mark.line + 1, best.start_mark.column + 1
