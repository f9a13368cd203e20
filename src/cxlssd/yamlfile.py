"""Reading the project's YAML files (platform configs, profiles, experiments) with
errors that name the file, the line and the problem, in bounded time and memory.

Only regular files up to :data:`MAX_YAML_BYTES` are read (a FIFO or a device is
refused, never opened for reading), as UTF-8; aliases may not expand the document
past :data:`MAX_YAML_NODES` nodes (a 370-byte "billion laughs" file stays small
as parsed but explodes when walked), nor nest deeper than :data:`MAX_YAML_DEPTH`
(checked on the event stream, before anything recursive runs).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import yaml

from cxlssd.errors import ConfigError

MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 64
SHORT_REPR_CHARS = 80


def shorten(text: str, limit: int = SHORT_REPR_CHARS) -> str:
    """``text`` cut to ``limit`` characters (saying how long it was), for messages."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def short_repr(value: object, limit: int = SHORT_REPR_CHARS) -> str:
    """``repr(value)`` cut to ``limit`` characters, for error messages (a value from a
    file can be megabytes long). Containers are cut before they are rendered whole."""
    if isinstance(value, list | tuple | dict | set) and len(value) > limit:
        return f"a {type(value).__name__} of {len(value)} items"
    return shorten(repr(value), limit)


def read_input_bytes(path: Path, what: str, limit_bytes: int) -> bytes:
    """The contents of ``path``, a regular file of at most ``limit_bytes``; a
    :class:`ConfigError` naming ``what`` otherwise (a FIFO is never waited on)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise ConfigError(f"cannot read {what} {path}: {error.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        found = os.fstat(fd)
        if not stat.S_ISREG(found.st_mode):
            raise ConfigError(f"{what} {path} is not a regular file")
        if found.st_size > limit_bytes:
            raise ConfigError(f"{what} {path} is {found.st_size} bytes; at most {limit_bytes} are read")
        try:
            return file.read(limit_bytes + 1)[:limit_bytes]
        except OSError as error:
            raise ConfigError(f"cannot read {what} {path}: {error.strerror}") from None


# libyaml's parser when PyYAML has it: linear in the input, where the pure-Python
# scanner is quadratic in the nesting depth.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN_EVENTS = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE_EVENTS = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def _check_depth(text: str, path: Path) -> None:
    """Refuse nesting past MAX_YAML_DEPTH from the event stream, before any recursive
    composing (a file of a million '[' would exhaust the stack)."""
    depth = 0
    for event in yaml.parse(text, Loader=_LOADER):
        if isinstance(event, _OPEN_EVENTS):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(f"{path}: nested deeper than {MAX_YAML_DEPTH} levels")
        elif isinstance(event, _CLOSE_EVENTS):
            depth -= 1


def _expanded_nodes(node: yaml.Node, path: Path, sizes: dict[int, int]) -> int:
    """How many nodes ``node`` stands for once its aliases are expanded; a
    ConfigError past MAX_YAML_NODES or on a node that contains itself."""
    known = sizes.get(id(node))
    if known is not None:
        if known < 0:
            raise ConfigError(f"{path}: an alias refers to a node that contains it")
        return known
    sizes[id(node)] = -1
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    total = 1 + sum(_expanded_nodes(child, path, sizes) for child in children)
    if total > MAX_YAML_NODES:
        raise ConfigError(
            f"{path}: aliases expand to more than {MAX_YAML_NODES} values; write it out plainly"
        )
    sizes[id(node)] = total
    return total


def read_yaml(path: Path, what: str) -> object:
    """The parsed document of ``path``; ``what`` names it in errors ("platform config")."""
    data = read_input_bytes(path, what, MAX_YAML_BYTES)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConfigError(f"{path}: {what} is not UTF-8 text (byte {error.start})") from None
    try:
        _check_depth(text, path)
        loader = _LOADER(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            _expanded_nodes(node, path, {})
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = str(getattr(error, "problem", None) or error)
        raise ConfigError(f"{path}: malformed YAML{where}: {shorten(problem, 200)}") from None
    except ValueError as error:  # a value YAML parses but Python cannot hold (a 5000-digit int)
        raise ConfigError(f"{path}: a value cannot be read: {shorten(str(error), 200)}") from None
