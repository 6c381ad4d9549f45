"""Parse and validate allocator settings strictly, before anything is applied.

Two forms are read: ``key=value key=value`` (spaces or commas between settings) and torch's
own ``key:value,key:value``, where ``roundup_power2_divisions`` may be a list
``[256:1,512:2,>:4]``. torch's parser ignores every space, accepts junk after a number
(``stoull("128abc")`` is 128) and keeps the keys before a bad one; this one rejects all of
that, so a string it accepts is one every torch that has the keys accepts.
"""
from __future__ import annotations

import difflib
import re
import sys
from typing import Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..errors import UserError
from ..spelling import command
from .schema import (ALIASES, BOOLEAN, BY_NAME, CHOICE, DIVISIONS, FRACTION, GREATER_AFTER_LAST,
                     INT_LIMIT, NEWEST, OLDEST, POWER_OF_TWO, RESERVE, RESERVE_TABLE, ROCM_ENV_NAMES,
                     ROUNDUP_INTERVALS, ZERO_DIVISIONS, Key, Version, whole_number)

Settings = Tuple[Tuple[str, str], ...]  # (key, canonical value) in the order given

_SEPARATORS = ",:=[]"
_DECIMAL = re.compile(r"[0-9]+(\.[0-9]*)?|\.[0-9]+")  # no sign, no exponent, no inf/nan
_INTERVAL_LIMIT = 2 ** 62
# A reserve is made in bytes (a size_t): at most this many GiB, or this many times a GPU's memory
# (of up to 1 TiB); both hold every real reserve and keep torch's size_t from wrapping around.
_RESERVE_GIB_LIMIT = 2 ** 34
_RESERVE_FRACTION_LIMIT = 2 ** 24


def shown(text: str, limit: int = 80) -> str:
    """``text`` as a message repeats it: whole up to ``limit`` characters, else its start and
    its length, so that a pasted 5000-digit number does not fill the screen."""
    return text if len(text) <= limit else f"{text[:limit // 2]}… ({len(text)} characters)"


class AllocConfError(UserError, ValueError):
    """A setting that is malformed, unknown, out of range or not in the installed torch."""


def version_of(text: Optional[str]) -> Optional[Version]:
    """(2, 13) from "2.13.0+cpu"; None when unknown."""
    match = re.match(r"(\d+)\.(\d+)", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def format_version(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


def _tokens(text: str) -> List[str]:
    """Split into words, the separators ``, : = [ ]`` and single " " for runs of spaces."""
    tokens: List[str] = []
    word = ""
    for char in text:
        if char in _SEPARATORS or char.isspace():
            if word:
                tokens.append(word)
                word = ""
            if char in _SEPARATORS:
                tokens.append(char)
            elif not tokens or tokens[-1] != " ":
                tokens.append(" ")
        else:
            word += char
    if word:
        tokens.append(word)
    return tokens


class _Reader:
    def __init__(self, text: str):
        self.text = text
        self.tokens = _tokens(text)
        self.index = 0

    def peek(self, skip_space: bool = True) -> Optional[str]:
        if skip_space:
            self.skip_space()
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def skip_space(self) -> bool:
        skipped = False
        while self.index < len(self.tokens) and self.tokens[self.index] == " ":
            self.index += 1
            skipped = True
        return skipped

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise self.error("the string ends too early")
        self.index += 1
        return token

    def word(self, what: str) -> str:
        token = self.peek()
        if token is None or token in _SEPARATORS:
            found = "the end" if token is None else f"{token!r}"
            raise self.error(f"expected {what} but found {found}")
        self.index += 1
        return token

    def error(self, message: str) -> AllocConfError:
        return AllocConfError(f"malformed setting {shown(self.text)!r}: {message}")


def parse(text: str) -> Settings:
    """Parse one string in either form into (key, raw value) pairs; syntax only.

    ROCm's spellings of a key (``release_lock_on_hipmalloc``) come back as the key's own name,
    which every build accepts too, so that both spellings merge and count as one key.
    """
    reader = _Reader(text)
    variable = reader.peek()
    if variable in ROCM_ENV_NAMES:  # every variable's name: a shell line pasted whole, NAME=...
        value = text.split("=", 1)[1].strip() if "=" in text else ""
        raise AllocConfError(f"{variable} is the environment variable, not an allocator key: "
                             f"give only its value ({value or 'e.g. expandable_segments:True'}); "
                             f"both variables are written for you")
    form = "=" if "=" in reader.tokens else ":"
    settings: List[Tuple[str, str]] = []
    while reader.peek() is not None:
        key = reader.word("a key")
        separator = reader.peek()
        if separator not in (":", "="):
            found = "the end" if separator is None else repr(separator)
            raise reader.error(f"expected '=' or ':' after {key!r} but found {found}")
        if separator != form:
            raise reader.error("use either key=value or torch's key:value form, not both")
        reader.take()
        value = _value(reader, key)
        settings.append((ALIASES.get(key, key), value))
        had_space = reader.skip_space()
        following = reader.peek()
        if following is None:
            break
        if following == ",":
            reader.take()
            if form == ":" and reader.peek() is None:
                break  # torch accepts one trailing comma
            continue
        if form == "=" and had_space:
            continue
        if form == ":" and had_space and following not in _SEPARATORS:
            raise reader.error(f"put a ',' before {following!r}: torch's form separates "
                               f"settings with commas")
        raise reader.error(f"unexpected {following!r} after {key}'s value")
    return tuple(settings)


def _value(reader: _Reader, key: str) -> str:
    """One value: a word, or a list ``[name:value,...]`` (divisions, or reserves per class)."""
    if reader.peek() != "[":
        return reader.word(f"a value for {key}")
    reader.take()
    entries = []
    while True:
        name = reader.word(f"an entry in {key}'s list")
        if reader.take() != ":":
            raise reader.error(f"expected ':' after {name!r} in {key}'s list")
        entries.append(f"{name}:{reader.word(f'a value for {name} in {key}')}")
        closing = reader.take()
        if closing == "]":
            return "[" + ",".join(entries) + "]"
        if closing != ",":
            raise reader.error(f"expected ',' or ']' in {key}'s list, found {closing!r}")


def parse_many(texts: Iterable[str]) -> Settings:
    """Parse several strings (the magic's positional arguments) into one set of settings.

    A string that ends with a separator, or the next one that starts with one, is the same
    setting that the shell split at its spaces: ``max_split_size_mb = 128`` is one setting.
    """
    joined: List[str] = []
    for text in texts:
        if joined and (joined[-1].rstrip()[-1:] in ",:=[" or text.lstrip()[:1] in ",:=]"):
            joined[-1] += " " + text
        else:
            joined.append(text)
    settings: List[Tuple[str, str]] = []
    for text in joined:
        settings.extend(parse(text))
    return tuple(settings)


def unknown_key_message(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), list(BY_NAME) + list(ALIASES), n=1,
                                      cutoff=0.6)
    hint = f"did you mean {close[0]!r}? " if close else ""
    every = command("%alloc_conf --keys", "colab_gpu.allocator.KEYS")
    return f"unknown allocator key {name!r} ({hint}{every} lists every key)"


def check_key_name(name: str) -> Key:
    key = BY_NAME.get(ALIASES.get(name, name))
    if key is None:
        raise AllocConfError(unknown_key_message(name))
    return key


def format_number(value: float) -> str:
    """2147483647, not 2.14748e+09: a bound the user may have to type back exactly."""
    return str(int(value)) if value == int(value) and abs(value) >= 1 else f"{value:g}"


def _range_text(key: Key, version: Version, given: Optional[Mapping[str, str]]) -> str:
    low = key.lowest(version, given)
    followed = key.followed(version)
    parts = []
    if key.followed_value(version, given) is not None and low is not None:
        parts.append(f">= {followed}={format_number(low[0])}")
    elif low is not None:
        parts.append(f"{'>' if low[1] else '>='} {format_number(low[0])}" + (
            f" ({followed}'s default; a smaller {followed} allows less)" if followed else ""))
    if key.maximum is not None:
        parts.append(f"{'<' if key.high_open else '<='} {format_number(key.maximum)}")
    return " and ".join(parts)


def _in_range(key: Key, version: Version, number: float, given: Optional[Mapping[str, str]]) -> bool:
    low = key.lowest(version, given)
    if low is not None and (number <= low[0] if low[1] else number < low[0]):
        return False
    if key.maximum is not None and (number >= key.maximum if key.high_open else number > key.maximum):
        return False
    return True


def _is_power_of_two(number: int) -> bool:
    return number > 0 and number & (number - 1) == 0


def canonical_value(key: Key, value: str, version: Version, rocm: bool = False,
                    given: Optional[Mapping[str, str]] = None) -> str:
    """The value as torch should read it, or AllocConfError saying what is accepted.

    ``rocm``: the installed torch is a ROCm build, which accepts ``key.rocm_choices`` too;
    ``given``: the setting's other keys, for a bound that follows one of them.
    """
    where = f"{key.name}={shown(value)}"
    if key.kind == BOOLEAN:
        if value not in ("True", "False"):
            fix = f" (write {value.capitalize()})" if value.lower() in ("true", "false") else ""
            raise AllocConfError(f"{where}: takes True or False, capitalized as in Python{fix}")
        return value
    if key.kind == CHOICE:
        choices = key.choices + (key.rocm_choices if rocm else ())
        if value in key.rocm_choices and not rocm:
            raise AllocConfError(f"{where}: only ROCm builds of torch accept {value} and the "
                                 f"installed torch is not one; takes one of "
                                 f"{', '.join(key.choices)}")
        if value not in choices:
            close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise AllocConfError(f"{where}: takes one of {', '.join(choices)}{hint}")
        return value
    if key.kind == DIVISIONS:
        return _divisions(key, value, version)
    if key.kind == RESERVE:
        return _reserve(where, value)
    if key.kind == RESERVE_TABLE:
        return _reserve_table(where, value)
    if key.kind == FRACTION:
        if not _DECIMAL.fullmatch(value):
            raise AllocConfError(f"{where}: takes a decimal number like 0.5, "
                                 f"{_range_text(key, version, given)}")
        fraction = float(value)
        # torch's stod refuses values that underflow to subnormals: keep clear of them
        if not _in_range(key, version, fraction, given) or 0 < fraction < sys.float_info.min:
            raise AllocConfError(f"{where} is out of range: must be {_range_text(key, version, given)}")
        return repr(fraction) if fraction != int(fraction) else f"{fraction:.1f}"
    number = whole_number(value)
    if number is None:
        raise AllocConfError(f"{where}: takes a whole number, {_range_text(key, version, given)}")
    if key.kind == POWER_OF_TWO and not _is_power_of_two(number):
        assert key.maximum is not None  # the schema bounds every power-of-two key
        raise AllocConfError(f"{where}: must be a power of two (1, 2, 4, ... "
                             f"{format_number(key.maximum)})")
    if not _in_range(key, version, number, given):
        raise AllocConfError(f"{where} is out of range: must be {_range_text(key, version, given)}")
    return str(number)


def _list_entries(value: str) -> Iterator[Tuple[str, str]]:
    """(name, value) pairs of a list value as ``_value`` wrote it: ``[name:value,...]``."""
    for entry in value[1:-1].split(","):
        name, entry_value = entry.split(":", 1)
        yield name, entry_value


def _reserve(where: str, value: str) -> str:
    """A fraction of the GPU's memory or a number of GiB; torch 2.15 ignores (with a warning)
    what it cannot read, so refuse it here instead."""
    gib = value.endswith("G")
    number = value[:-1] if gib else value
    limit = _RESERVE_GIB_LIMIT if gib else _RESERVE_FRACTION_LIMIT
    if not _DECIMAL.fullmatch(number) or not 0 < float(number) < limit:  # float("9" * 400) is inf
        raise AllocConfError(f"{where}: takes a positive fraction of the GPU's memory like 0.5 "
                             f"(the default reserve is 1.125; below {limit}), or a number of GiB like "
                             f"40G (below {_RESERVE_GIB_LIMIT}G)")
    return value


def _reserve_table(where: str, value: str) -> str:
    """``[class:reserve,...]``; torch keeps the last of a repeated class, so refuse repeats."""
    if not value.startswith("["):
        raise AllocConfError(f"{where}: takes a list of stream classes and their reserves, "
                             f"like [serving:0.25,workspace:8G]")
    seen = set()
    for name, reserve in _list_entries(value):
        if name in seen:
            raise AllocConfError(f"{where}: the class {shown(name)!r} is given twice")
        seen.add(name)
        _reserve(f"{where}: the reserve of {shown(name)!r}", reserve)
    return value


def _divisions(key: Key, value: str, version: Version) -> str:
    where = f"{key.name}={shown(value)}"
    if not value.startswith("["):
        number = whole_number(value)
        if number is None or not _is_power_of_two(number) or number > INT_LIMIT:
            raise AllocConfError(f"{where}: takes a power of two (1, 2, 4, 8, ... "
                                 f"{format_number(2 ** 30)}) or a list like [256:1,512:2,>:4]")
        return str(number)
    if version < (2, 0):
        raise AllocConfError(f"{where}: the list form needs torch >= 2.0 (installed "
                             f"{format_version(version)}); give one power of two instead")
    entries = []
    for interval, divisions in _list_entries(value):
        size = whole_number(interval)
        if interval != ">" and not (size is not None and _is_power_of_two(size) and size <= _INTERVAL_LIMIT):
            raise AllocConfError(f"{where}: each interval is a power of two in MB up to "
                                 f"{format_number(_INTERVAL_LIMIT)} (or '>' for all larger sizes), "
                                 f"got {shown(interval)!r}")
        zero_allowed = version >= ZERO_DIVISIONS
        count = whole_number(divisions)
        if count is None or count > INT_LIMIT or not (
                (zero_allowed and count == 0) or _is_power_of_two(count)):
            accepted = "0 (no rounding) or a power of two" if zero_allowed else \
                f"a power of two (0 needs torch >= {format_version(ZERO_DIVISIONS)})"
            raise AllocConfError(f"{where}: the divisions for {shown(interval)} must be {accepted} up "
                                 f"to {format_number(2 ** 30)}, got {shown(divisions)!r}")
        entries.append(f"{size if interval != '>' else '>'}:{count}")
    return "[" + ",".join(entries) + "]"


def roundup_table(value: Optional[str], version: Optional[Version] = None) -> List[int]:
    """Per interval of request sizes (index 0: under 2 MiB, i: 2**i MiB up to 2**(i+1), the
    last: 32 GiB and over), the divisions a ``roundup_power2_divisions`` value gives, filled as
    torch's parseRoundUpPower2Divisions fills them: all 0 (no rounding) where ``value`` is None,
    AllocConfError where ``version`` (newest known if None) refuses it."""
    if value is None:
        return [0] * ROUNDUP_INTERVALS
    version = _clamp(version)
    value = _divisions(BY_NAME["roundup_power2_divisions"], value, version)
    if not value.startswith("["):
        return [int(value)] * ROUNDUP_INTERVALS
    table = [0] * ROUNDUP_INTERVALS
    last, first = 0, True
    after = 1 if version >= GREATER_AFTER_LAST else 0  # '>' from the last interval named, or after it
    for interval, divisions in _list_entries(value):
        if interval == ">":
            table[last + after:] = [int(divisions)] * (ROUNDUP_INTERVALS - last - after)
            continue
        last = min(int(interval).bit_length() - 1, ROUNDUP_INTERVALS - 1)
        if first:  # the first value holds for every smaller size too
            table[:last], first = [int(divisions)] * last, False
        table[last] = int(divisions)
    return table


def validate(settings: Settings, version: Optional[Version], rocm: bool = False,
             given: Optional[Mapping[str, str]] = None) -> Settings:
    """Check every key and value against ``version`` (newest known if None); canonical values.

    ``rocm``: the installed torch is a ROCm build; ``given``: the whole setting ``settings`` is
    part of, for a bound that follows another key (``settings`` itself where None). All problems
    are collected, so one error names everything that is wrong.
    """
    version = _clamp(version)
    problems: List[str] = []
    seen = set()
    result = []
    for name, value in settings:
        if name in seen:
            problems.append(f"{name} is given twice")
            continue
        seen.add(name)
        key = BY_NAME.get(name)
        if key is None:
            problems.append(unknown_key_message(name))
            continue
        if not key.available(version):
            problems.append(availability_message(key, version))
            continue
        try:
            result.append((name, canonical_value(key, value, version, rocm,
                                                 dict(settings) if given is None else given)))
        except AllocConfError as error:
            problems.append(str(error))
    if problems:
        raise AllocConfError("; ".join(problems))
    return tuple(result)


def availability_message(key: Key, version: Version) -> str:
    installed = format_version(version)
    if version < key.added:
        return (f"{key.name} needs torch >= {format_version(key.added)} (added in "
                f"{format_version(key.added)}); the installed torch is {installed}")
    assert key.removed is not None  # unavailable, not too old: removed
    return (f"{key.name} was removed in torch {format_version(key.removed)}; the installed "
            f"torch is {installed}")


def _clamp(version: Optional[Version]) -> Version:
    if version is None or version > NEWEST:
        return NEWEST
    return max(version, OLDEST)


def to_torch(settings: Settings) -> str:
    """torch's own form, the string written to the environment."""
    return ",".join(f"{name}:{value}" for name, value in settings)


def merge(base: Settings, changes: Settings, unset: Sequence[str] = ()) -> Settings:
    """``base`` with ``unset`` keys removed and ``changes`` applied (changed keys keep their
    place; a key ``base`` repeats, which torch reads as its last value, becomes one)."""
    updates = dict(changes)
    merged, replaced = [], set()
    for name, value in base:
        if name in unset or name in replaced:
            continue
        if name in updates:
            value = updates.pop(name)
            replaced.add(name)
        merged.append((name, value))
    return tuple(merged) + tuple(updates.items())
