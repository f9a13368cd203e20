"""Typed configuration (issue 17): the models' one-line messages (key path, value, fix;
never pydantic's own report) and the command-line options generated from their fields."""

from __future__ import annotations

import argparse
from typing import Annotated, ClassVar

import pytest
from pydantic import Field, StrictInt, ValidationError, field_validator

from cxlssd.errors import ConfigError, InputError
from cxlssd.firmware.knobs import GcStorm
from cxlssd.models import Cli, ConfigModel, add_options, cli_spelling, flag_of, options_input
from cxlssd.platform.inject import DcAdd, GeneralMediaEvent, Uncorrectable


class Item(ConfigModel):
    size_bytes: StrictInt
    name: str = "x"

    @field_validator("size_bytes")
    @classmethod
    def _even(cls, value: int) -> int:
        if value % 2:
            raise ValueError(f"{value} is odd; use {value + 1}")
        return value


class Holder(ConfigModel):
    label: ClassVar[str] = "holder"
    items: tuple[Item, ...] = ()
    count: Annotated[StrictInt, Cli(flag="--many")] = Field(default=1, description="how many")
    fast: bool = Field(default=False, description="go fast")
    loud: bool = Field(default=True, description="speak up")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"items": [{"size_bytes": 3}]}, "t.yaml: top.items[0].size_bytes: 3 is odd; use 4"),
        ({"items": [{"size_byte": 2}]},  # the misspelt key first: it explains the missing one
         "t.yaml: top.items[0]: unknown key 'size_byte'; did you mean 'size_bytes'? (and 1 more problem(s))"),
        ({"zebra": 1}, "t.yaml: top: unknown key 'zebra'; allowed keys: count, fast, items, loud"),
        ({"items": [{}]}, "t.yaml: top.items[0]: missing 'size_bytes'"),
        ({"count": "3"}, "t.yaml: top.count: expected an integer, got '3'"),
        ({"count": True, "fast": 2},
         "t.yaml: top.count: expected an integer, got True (and 1 more problem(s))"),
        (["count"], "t.yaml: top: expected a mapping of keys (items, count, fast, loud), got ['count']"),
    ],
)
def test_a_problem_is_one_line_naming_the_key_path_the_value_and_the_fix(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        Holder.parse(raw, "t.yaml: top")
    assert str(raised.value) == message
    assert not isinstance(raised.value, ValidationError)


def test_constructing_a_model_raises_the_projects_error_with_its_label() -> None:
    with pytest.raises(ConfigError, match=r"^holder items\[0\]\.size_bytes: 1 is odd; use 2$"):
        Holder(items=({"size_bytes": 1},))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^Item size_bytes: 5 is odd"):  # no label: the class name
        Item(size_bytes=5)
    # A knob's problem is an InputError (a control-file line, a scenario entry)
    with pytest.raises(InputError, match="gc-storm: needs exactly one of --duration-ms"):
        GcStorm()


def _parser(model: type[ConfigModel]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_options(parser, model)
    return parser


def test_options_are_made_from_the_fields() -> None:
    parser = _parser(Holder)
    flags = {option for action in parser._actions for option in action.option_strings}
    assert {"--many", "--fast", "--no-loud"} <= flags  # renamed; bool switches flip the default
    assert options_input(parser.parse_args([]), Holder) == {}  # the model's defaults apply
    given = options_input(parser.parse_args(["--many", "0x10", "--fast", "--no-loud"]), Holder)
    assert Holder.parse(given) == Holder(count=16, fast=True, loud=False)
    assert cli_spelling(Holder)("count") == "--many"
    help_text = parser.format_help()
    assert "how many (default 1)" in help_text and "go fast" in help_text


def test_a_tuple_of_models_is_given_by_its_key_with_shared_options() -> None:
    parser = _parser(Uncorrectable)
    args = parser.parse_args(["--type", "internal", "--type", "mem-data-ecc", "--header", "1,0x2"])
    assert Uncorrectable.parse(options_input(args, Uncorrectable)) == Uncorrectable(errors=(
        {"error_type": "internal", "header": (1, 2)}, {"error_type": "mem-data-ecc", "header": (1, 2)},
    ))  # type: ignore[arg-type]


def test_one_of_groups_and_presets_come_from_the_model() -> None:
    parser = _parser(GcStorm)
    with pytest.raises(argparse.ArgumentError, match="not allowed with argument"):
        parser.parse_args(["--duration-ms", "1", "--blocks", "2"])
    assert flag_of("dies", GcStorm.model_fields["dies"]) == "--dies"  # the field's name by default


def test_bit_masks_and_enums_take_names_in_every_form() -> None:
    by_names = GeneralMediaEvent(
        dpa=0, flags="permanent,maintenance-needed", descriptor="threshold"  # type: ignore[arg-type]
    )
    assert by_names.flags == 0xC and by_names.descriptor == 2
    assert GeneralMediaEvent(dpa=0, flags="0x4").flags == 4  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"general-media flags: 'permanant' is not one of permanent"):
        GeneralMediaEvent(dpa=0, flags="permanant")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"dc-add extents\[0\]: extent 5 is not an offset and a length"):
        DcAdd(extents=(5,))  # type: ignore[arg-type]
