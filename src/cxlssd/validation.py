"""The checks every configuration reader shares (platform configs, firmware profiles,
experiments, scenarios, injections): one size parser, one "did you mean", one check for
unknown keys, so that a size or a misspelt name means and reads the same everywhere."""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable
from fractions import Fraction

from cxlssd.errors import ConfigError
from cxlssd.yamlfile import short_repr

SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
# Digits bounded, so converting stays cheap on hostile input; units are binary only
# (a "GB" is ambiguous), in any case.
_SIZE_RE = re.compile(r"^\s*(\d{1,19}(?:\.\d{1,9})?)\s*([A-Za-z]{0,3})\s*$")
_MATCH_MAX_CHARS = 100  # difflib is quadratic: no suggestion for longer words


def size_bytes(value: object, minimum_bytes: int = 1) -> int:
    """Bytes from an int or a string such as ``"448MiB"``, ``"1.5GiB"`` or ``"4096"``: a
    whole number of bytes, at least ``minimum_bytes``. A :class:`ValueError` saying the
    value and the fix otherwise (a model's validator: the model adds the key)."""
    size: Fraction | int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        size = value
    elif isinstance(value, str) and (match := _SIZE_RE.match(value)):
        unit = SIZE_UNITS.get(match.group(2).lower())
        size = None if unit is None else Fraction(match.group(1)) * unit
    if size is None or size.denominator != 1:
        raise ValueError(f"{short_repr(value)} is not a size; write a whole number of bytes, "
                         "or a number with KiB/MiB/GiB/TiB, e.g. 448MiB or 1.5GiB")
    if size < minimum_bytes:
        raise ValueError(f"size must be at least {minimum_bytes} bytes, got {short_repr(value)}")
    return int(size)


def parse_size(value: object, key: str, *, minimum_bytes: int = 1) -> int:
    """:func:`size_bytes`, or a :class:`ConfigError` naming ``key``."""
    try:
        return size_bytes(value, minimum_bytes)
    except ValueError as error:
        raise ConfigError(f"{key}: {error}") from None


def format_size(size_bytes: int) -> str:
    """The largest binary unit that divides ``size_bytes``: ``"768MiB"``, ``"5B"``."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if size_bytes % SIZE_UNITS[unit.lower()] == 0:
            return f"{size_bytes // SIZE_UNITS[unit.lower()]}{unit}"
    return f"{size_bytes}B"


def close_match(word: str, choices: Iterable[str]) -> str | None:
    """The choice closest to ``word``, if one is close enough."""
    if len(word) > _MATCH_MAX_CHARS:
        return None
    close = difflib.get_close_matches(word, list(choices), n=1)
    return close[0] if close else None


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the choice closest to ``word``, or ``""``."""
    close = close_match(word, choices)
    return f" (did you mean {close!r}?)" if close else ""


def check_keys(section: Iterable[object], allowed: Iterable[str], where: str) -> None:
    """A :class:`ConfigError` for the first key of ``section`` not in ``allowed``, with the
    closest allowed key, or the list of them."""
    allowed = sorted(allowed)
    for key in section:
        if key not in allowed:
            close = close_match(str(key), allowed)
            fix = f"did you mean {close!r}?" if close else f"allowed keys: {', '.join(allowed)}"
            raise ConfigError(f"{where}: unknown key {short_repr(str(key))}; {fix}")
