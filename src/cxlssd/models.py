"""Typed configuration: the base of the configuration models (pydantic v2), the one
place where pydantic's :class:`~pydantic.ValidationError` becomes the project's error,
and the command-line options generated from a model's fields.

A model's fields say everything about a setting once: its type, range and domain
checks (validators raising :class:`ValueError` with the value and the fix), its
description. Readers of YAML validate through :meth:`ConfigModel.parse` (naming the
file and key path), Python callers construct the model (``Poison(dpa=0x1000)``) and
the CLI is built from the fields by :func:`add_options` / :func:`options_input`.
Either way a problem is one line, a :class:`~cxlssd.errors.CxlssdError` (the model's
:attr:`~ConfigModel.error_class`), never pydantic's multi-line report.
"""

from __future__ import annotations

import argparse
import contextvars
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo

from cxlssd.errors import ConfigError, CxlssdError
from cxlssd.validation import close_match, format_size, size_bytes
from cxlssd.yamlfile import short_repr

# How deep model construction is nested: only the outermost construction turns a
# ValidationError into the project's error, so a nested model's problem keeps its
# full key path (pydantic merges a nested ValidationError into the outer one).
_DEPTH: contextvars.ContextVar[int] = contextvars.ContextVar("cxlssd_model_depth", default=0)


@dataclass(frozen=True)
class _Source:
    """Where the input being parsed comes from (a file and key path), and how its keys
    are spelt there: the CLI's options (``spell``), or dotted keys (``cache.ways=8``)."""

    where: str = ""
    spell: Callable[[str], str] | None = None
    dotted: bool = False


# The source of the input of the outermost model being parsed, for its message.
_UNNAMED = _Source()
_SOURCE: contextvars.ContextVar[_Source] = contextvars.ContextVar("cxlssd_model_source", default=_UNNAMED)


class ConfigModel(BaseModel):
    """Base of the configuration models: unknown keys are errors (with the closest
    known key), instances are immutable, and a validation problem raises
    :attr:`error_class` with a one-line message."""

    # validate_by_name: a field with a file key of its own (size_bytes: ``size``) is also
    # given by its name from Python.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_by_name=True)
    #: the project's error a problem raises (firmware knobs: InputError)
    error_class: ClassVar[type[CxlssdError]] = ConfigError
    #: what messages call an instance when no file or key path is given (default: its
    #: ``kind``, e.g. "poison", if it has one)
    label: ClassVar[str] = ""
    #: fields the reader sets, not keys of the file (a config's source)
    reader_fields: ClassVar[frozenset[str]] = frozenset()
    #: groups of fields of which the command line takes exactly one (add_options)
    cli_one_of: ClassVar[tuple[tuple[str, ...], ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _empty_section(cls, raw: object) -> object:
        """A YAML key with nothing under it (``guest:``) is an empty section: the defaults."""
        return {} if raw is None else raw

    def __init__(self, /, **data: Any) -> None:
        depth = _DEPTH.set(_DEPTH.get() + 1)
        try:
            super().__init__(**data)
        except ValidationError as error:
            if _DEPTH.get() > 1:
                raise  # pydantic adds it, with its key path, to the outer model's error
            raise self.error_class(validation_message(error, type(self), _SOURCE.get())) from None
        finally:
            _DEPTH.reset(depth)

    @classmethod
    def parse(
        cls, raw: object, where: str = "", spell: Callable[[str], str] | None = None, dotted: bool = False
    ) -> Self:
        """``raw`` (a YAML mapping) validated; a problem is :attr:`error_class` naming
        ``where`` (file and key path) and the key path inside ``raw`` (spelt by ``spell``;
        with ``dotted``, an unknown key and its suggestion as the dotted keys the
        input came as, e.g. overrides)."""
        raw = {} if raw is None else raw  # an empty YAML document or section: the defaults
        if not isinstance(raw, Mapping):
            raise cls.error_class(f"{where or _label(cls)}: expected a mapping of keys "
                                  f"({', '.join(_file_keys(cls))}), got {short_repr(raw)}")
        source = _SOURCE.set(_Source(where, spell, dotted))
        try:
            return cls.model_validate(dict(raw))  # through __init__, which raises error_class
        finally:
            _SOURCE.reset(source)


# A size in bytes: an integer or a number with a binary unit ("448MiB", "1.5GiB").
SizeBytes = Annotated[int, BeforeValidator(size_bytes)]


def _size_or_zero(value: object) -> int:
    return size_bytes(value, minimum_bytes=0)


# The same, where 0 leaves the part out.
SizeOrZeroBytes = Annotated[int, BeforeValidator(_size_or_zero)]


def number_in(low: float, high: float, unit: str) -> BeforeValidator:
    """A number of ``unit`` in ``low..high`` as a float: not true/false (YAML's 1/0), not
    NaN; the message says the range."""

    def check(value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise ValueError(f"expected {low:.0f}..{high:.0f} {unit}, got {short_repr(value)}")
        return float(value)

    return BeforeValidator(check)


# -- messages -------------------------------------------------------------------------


def _label(model: type[BaseModel]) -> str:
    """What messages call the model: its label, else its kind, else its class name."""
    return str(getattr(model, "label", "") or getattr(model, "kind", "")) or model.__name__


def _field_model(annotation: object) -> type[BaseModel] | None:
    """The model a field holds (itself, in a tuple, or optional), if any."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in typing.get_args(annotation):
        found = _field_model(argument)
        if found is not None:
            return found
    return None


def _keys(model: type[BaseModel]) -> dict[str, FieldInfo]:
    """A model's fields by the key a file writes (``size`` for ``size_bytes``)."""
    return {info.validation_alias if isinstance(info.validation_alias, str) else name: info
            for name, info in model.model_fields.items()}


def _file_keys(model: type[BaseModel]) -> list[str]:
    """The keys a file may write: not the fields its reader sets (a config's source)."""
    readers: frozenset[str] = getattr(model, "reader_fields", frozenset())
    return [key for key, info in _keys(model).items() if _name_of(model, info) not in readers]


def _model_at(model: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The model that holds the keys at ``loc`` (list indexes skipped)."""
    for part in loc:
        if isinstance(part, int):
            continue
        info = _keys(model).get(part)
        found = _field_model(info.annotation) if info is not None else None
        if found is None:
            return None
        model = found
    return model


def key_path(loc: Sequence[int | str], spell: Callable[[str], str] | None = None) -> str:
    """``extents[1].offset`` from pydantic's ``("extents", 1, "offset")``; ``spell``
    renames the first key (a CLI option for a field)."""
    text = ""
    for n, part in enumerate(loc):
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            name = spell(part) if spell is not None and n == 0 else part
            text += f".{name}" if text else name
    return text


# What pydantic's type errors expect, in the words of a YAML file.
_EXPECTED = {
    "bool_type": "true or false", "int_type": "an integer", "int_from_float": "an integer",
    "float_type": "a number", "string_type": "text", "model_type": "a mapping of keys to values",
    "dict_type": "a mapping of keys to values", "tuple_type": "a list", "list_type": "a list",
    "path_type": "a file name",
}


def _problem(error: Mapping[str, Any], model: type[BaseModel], prefix: str = "") -> str:
    """What is wrong and the fix, for one of pydantic's error entries (an unknown key and
    its suggestion after ``prefix``)."""
    kind, loc, given = error["type"], error["loc"], error.get("input")
    if kind == "extra_forbidden":
        holder = _model_at(model, loc[:-1])
        allowed = [prefix + key for key in sorted(_file_keys(holder))] if holder is not None else []
        close = close_match(prefix + str(loc[-1]), allowed)
        fix = f"did you mean {close!r}?" if close else f"allowed keys: {', '.join(allowed)}"
        return f"unknown key {short_repr(prefix + str(loc[-1]))}; {fix}"
    if kind == "missing":
        holder = _model_at(model, loc[:-1])
        info = _keys(holder).get(str(loc[-1])) if holder is not None else None
        hint = f" ({info.description})" if info is not None and info.description else ""
        return f"missing {str(loc[-1])!r}{hint}"
    if kind in ("value_error", "assertion_error"):
        return str(error["ctx"]["error"])  # the validator's own words: value and fix
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", error["ctx"]["expected"])
        close = close_match(str(given), choices) if isinstance(given, str) else None
        fix = f" (did you mean {close!r}?)" if close else ""
        return f"expected one of {', '.join(choices)}, got {short_repr(given)}{fix}"
    expected = _EXPECTED.get(kind) or str(error["msg"]).removeprefix("Input should be ")
    return f"expected {expected}, got {short_repr(given)}"


def _join(where: str, path: str) -> str:
    """``t.yaml: guest.vcpus`` or ``t.yaml: workloads[0].inject[1].dpa``: a file's key path
    starts after ``: ``, and goes on after a ``where`` that already holds one."""
    if not where or not path:
        return where or path
    return f"{where}.{path}" if ": " in where else f"{where}: {path}"


class ChosenModelError(ValueError):
    """A validator's problem with a value it validated by a model the value chose (a
    scenario entry's ``kind``): messages go on into that model, its key path and keys."""

    def __init__(self, error: ValidationError, model: type[BaseModel]) -> None:
        super().__init__(str(error))
        self.error, self.model = error, model


def validate_as(model: type[ConfigModel], raw: object) -> Any:
    """``raw`` validated by ``model``, in a validator of an enclosing model whose field's
    type does not say which model (see :class:`ChosenModelError`)."""
    try:
        return model.model_validate(raw)
    except ValidationError as error:
        raise ChosenModelError(error, model) from None


def _first_problem(error: ValidationError) -> tuple[Mapping[str, Any], int]:
    """The problem a message names (an unknown key first, since it often explains a
    missing one), and how many there are."""
    problems = sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden")
    return problems[0], len(problems)


def validation_message(error: ValidationError, model: type[BaseModel], source: _Source = _UNNAMED) -> str:
    """One line for ``error`` (its first problem, inside a chosen model's if it is one):
    where it is (the source's file and key path, else the model's label), the key path,
    the bad value and the fix."""
    first, count = _first_problem(error)
    # the key path to the chosen model, and that model
    outer: tuple[int | str, ...] = ()
    holder = model
    while first["type"] == "value_error" and isinstance(first["ctx"]["error"], ChosenModelError):
        chosen = first["ctx"]["error"]
        outer += tuple(first["loc"])
        (first, inner_count), holder = _first_problem(chosen.error), chosen.model
        count += inner_count - 1
    inner = first["loc"][:-1] if first["type"] in ("extra_forbidden", "missing") else first["loc"]
    keys = (*outer, *inner)
    path, prefix = key_path(keys, source.spell), ""
    if source.dotted and first["type"] == "extra_forbidden":
        path, prefix = "", f"{path}." if path else ""
    place = _join(source.where, path) if source.where else f"{_label(model)} {path}".strip()
    more = f" (and {count - 1} more problem(s))" if count > 1 else ""
    return f"{place}: {_problem(first, holder, prefix)}{more}"


# -- command-line options generated from the fields -----------------------------------


@dataclass(frozen=True)
class Cli:
    """How a field appears on the command line where its default (``--field-name``,
    parsed by the field's type, help from its description) does not fit. Put it in
    the field's ``Annotated`` metadata."""

    flag: str | None = None  # the option instead of --field-name; "" for none (presets only)
    metavar: str | None = None
    parse: Callable[[str], object] | None = None  # instead of the type's parser (str: the model parses)
    repeat: bool = False  # may be given several times; the field gets the list
    # Flags that set a fixed value: (("--off", 0),). Pairs, not a dict: the metadata of
    # an optional field is hashed.
    presets: tuple[tuple[str, object], ...] = ()
    # A tuple of models given by one of their fields (repeatable); the item model's
    # other fields are options that apply to every item.
    item_key: str | None = None


def _annotated_cli(annotation: object) -> Iterator[Cli]:
    """The Cli metadata inside an annotation (``Annotated[float, Cli(...)] | None``)."""
    if typing.get_origin(annotation) is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        yield from (m for m in metadata if isinstance(m, Cli))
        yield from _annotated_cli(base)
    elif typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for member in typing.get_args(annotation):
            yield from _annotated_cli(member)


def _cli(info: FieldInfo) -> Cli:
    found = [m for m in info.metadata if isinstance(m, Cli)]
    return next(iter([*found, *_annotated_cli(info.annotation)]), Cli())


def flag_of(name: str, info: FieldInfo) -> str:
    """The option of field ``name`` (its own, else its first preset)."""
    cli = _cli(info)
    if cli.flag:
        return cli.flag
    if cli.flag == "" and cli.presets:
        return cli.presets[0][0]
    switch_off = _base_type(info.annotation) is bool and info.default is True
    return ("--no-" if switch_off else "--") + name.replace("_", "-")


def options_of(name: str, info: FieldInfo) -> list[str]:
    """Every option that sets field ``name``: its own, its presets, and for a tuple of
    models given by a key, the options of the item's other fields."""
    cli = _cli(info)
    options = [flag_of(name, info)] if cli.flag != "" else []
    options += [preset for preset, _ in cli.presets]
    item = _field_model(info.annotation) if cli.item_key is not None else None
    if item is not None:
        options += [flag_of(sub, i) for sub, i in item.model_fields.items() if sub != cli.item_key]
    return options


def _number(text: str) -> int:
    """An integer from the command line: decimal, or hex as ``0x...``."""
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number (decimal, or hex as 0x...)") from None


def _numbers(text: str) -> tuple[int, ...]:
    """Comma-separated integers: ``1,0x2,3``."""
    return tuple(_number(part) for part in text.split(",") if part)


def _decimal(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _base_type(annotation: object) -> object:
    """``int`` of ``StrictInt``, ``int | None``, ``Annotated[int, ...]``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        if any(_base_type(m) is str for m in members):
            return str  # a name or a number: the model tells which
        return _base_type(members[0]) if len(members) == 1 else annotation
    return annotation


def _option(name: str, info: FieldInfo) -> dict[str, Any]:
    """argparse keywords for field ``name`` (given: the model's default applies)."""
    cli = _cli(info)
    base = _base_type(info.annotation)
    keywords: dict[str, Any] = {"dest": name, "default": None}
    if base is bool:
        # A switch that flips the default (--not-repairable, --no-volatile)
        keywords["action"] = "store_false" if info.default is True else "store_true"
        return keywords
    if typing.get_origin(base) is Literal:
        keywords["choices"] = [str(c) for c in typing.get_args(base)]
    elif cli.parse is not None:
        keywords["type"] = cli.parse
    elif base is int:
        keywords["type"] = _number
    elif base is float:
        keywords["type"] = _decimal
    elif typing.get_origin(base) is tuple:
        keywords["type"], keywords["metavar"] = _numbers, "N,N,..."
    if cli.metavar:
        keywords["metavar"] = cli.metavar
    if cli.repeat:
        keywords["action"] = "append"
    return keywords


def _help(info: FieldInfo) -> str:
    text = info.description or ""
    default = info.get_default()
    if not info.is_required() and not (default is None or isinstance(default, bool) or default == ()):
        text += f" (default {default})"
    return text.replace("%", "%%")  # argparse formats help with %


def add_options(parser: argparse.ArgumentParser, model: type[ConfigModel]) -> None:
    """One option per field of ``model`` (see :class:`Cli`); the fields of each group of
    ``model.cli_one_of`` become a required choice of exactly one of their options."""
    groups: dict[str, Any] = {}
    for names in model.cli_one_of:
        group = parser.add_mutually_exclusive_group(required=True)
        groups.update(dict.fromkeys(names, group))
    for name, info in model.model_fields.items():
        target = groups.get(name, parser)
        cli = _cli(info)
        required = info.is_required() and name not in groups
        if cli.item_key is not None:
            item = _field_model(info.annotation)
            assert item is not None, f"{model.__name__}.{name}: item_key needs a tuple of models"
            key_info = item.model_fields[cli.item_key]
            keywords = _option(cli.item_key, key_info)
            keywords.update(dest=name, action="append", metavar=cli.metavar or keywords.get("metavar"))
            target.add_argument(flag_of(name, info), required=required, help=_help(key_info) + "; repeatable",
                                **keywords)
            for sub, sub_info in item.model_fields.items():
                if sub != cli.item_key:
                    keywords = _option(sub, sub_info)
                    parser.add_argument(flag_of(sub, sub_info), **{**keywords, "dest": f"{name}.{sub}"},
                                        help=_help(sub_info) + f" (each {flag_of(name, info)})")
            continue
        if cli.flag != "":
            keywords = _option(name, info)
            target.add_argument(flag_of(name, info), required=required, help=_help(info), **keywords)
        for preset, value in cli.presets:
            target.add_argument(preset, dest=name, action="store_const", const=value,
                                help=f"set {name} to {value!r}")


def options_input(args: argparse.Namespace, model: type[ConfigModel]) -> dict[str, Any]:
    """The model's input from the parsed options: those given (the model's defaults
    apply to the others)."""
    given: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        value = getattr(args, name, None)
        if value is None:
            continue
        item_key = _cli(info).item_key
        if item_key is not None:
            shared = {key.split(".", 1)[1]: v for key, v in vars(args).items()
                      if key.startswith(f"{name}.") and v is not None}
            value = [{item_key: v, **shared} for v in value]
        given[name] = value
    return given


def cli_spelling(model: type[BaseModel]) -> Callable[[str], str]:
    """Field name -> its option, for messages about a command line."""
    return lambda name: flag_of(name, model.model_fields[name]) if name in model.model_fields else name


# -- reference documentation generated from the fields --------------------------------


_SIZE_TYPE = "size (bytes, or with KiB/MiB/GiB/TiB)"


def _is_size(info: FieldInfo) -> bool:
    """Whether the field is a :data:`SizeBytes` or :data:`SizeOrZeroBytes` (pydantic keeps
    its validators in the field's metadata)."""
    sizes = (size_bytes, _size_or_zero)
    return any(isinstance(m, BeforeValidator) and m.func in sizes for m in info.metadata)


def _type_name(annotation: object) -> str:
    """How a reader writes a value of ``annotation``: ``integer``, ``list of integer``."""
    while typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    origin, arguments = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in arguments if a is not type(None))
    if origin is tuple:
        return f"list of {_type_name(arguments[0])}"
    if origin is dict:
        return f"mapping of {_type_name(arguments[0])} to {_type_name(arguments[1])}"
    if origin is Literal:
        return " \\| ".join(str(a) for a in arguments)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "{" + ", ".join(_file_keys(annotation)) + "}"
    names = {int: "integer", float: "number", str: "name", bool: "true/false", IPv4Network: "IPv4 subnet",
             Path: "path"}
    if annotation is Any:
        return "any value"
    return names.get(annotation, str(annotation)) if isinstance(annotation, type) else str(annotation)


def _name_of(model: type[BaseModel], info: FieldInfo) -> str:
    return next(name for name, i in model.model_fields.items() if i is info)


def _value_text(value: object, info: FieldInfo) -> str:
    """A default as a file writes it: sizes with their unit, models by their keys."""
    if isinstance(value, BaseModel):
        fields = _keys(type(value)).items()
        shown = [f"{key}: {_value_text(getattr(value, _name_of(type(value), i)), i)}" for key, i in fields
                 if getattr(value, _name_of(type(value), i)) is not None]
        return "{" + ", ".join(shown) + "}"
    if isinstance(value, tuple):
        return "[" + ", ".join(_value_text(item, info) for item in value) + "]"
    if isinstance(value, bool):
        return str(value).lower()
    return format_size(value) if _is_size(info) and isinstance(value, int) else str(value)


def _default_text(info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    default = info.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return "its defaults (below)"
    unset = default is None or default in ((), "")
    return "—" if unset else f"`{_value_text(default, info)}`"


def reference_table(models: Mapping[str, type[ConfigModel]], options: bool = True) -> str:
    """A Markdown table of every key of ``models`` (by kind or section): its key in a
    file, its CLI option (``options``), type, default and description, for the docs
    (a test keeps them current)."""
    head = ["kind", "key", *(["option"] if options else []), "type", "default", "description"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for kind, model in models.items():
        for key, info in _keys(model).items():
            name = _name_of(model, info)
            if name in model.reader_fields:
                continue
            cells = [f"`{kind}`", f"`{key}`"]
            if options:
                cells.append(", ".join(f"`{option}`" for option in options_of(name, info)))
            text = (info.description or "").replace("|", "\\|")
            type_text = _SIZE_TYPE if _is_size(info) else _type_name(info.annotation)
            cells += [type_text, _default_text(info), text]
            rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def generated_section(path: Path, name: str, text: str, update: bool = False) -> bool:
    """Whether the part of doc ``path`` between ``<!-- generated: NAME -->`` and
    ``<!-- end generated: NAME -->`` is ``text``; with ``update``, make it so."""
    begin, end = f"<!-- generated: {name} -->\n", f"<!-- end generated: {name} -->"
    before, rest = path.read_text().split(begin)
    current, after = rest.split(end)
    if current != text and update:
        path.write_text(before + begin + text + end + after)
        return True
    return current == text
