"""The magics' options: IPython's ``magic_arguments``, read as a shell reads a command line."""
from __future__ import annotations

import argparse
import functools
import re
import shlex
from typing import Any, Callable, Dict, List, Tuple

from IPython.core.error import UsageError
from IPython.core.magic_arguments import magic_arguments as ipython_magic_arguments


class magic_arguments(ipython_magic_arguments):
    """IPython's decorator, with abbreviated options refused: argparse took ``--jso`` for
    ``--json``, and such a word would silently change meaning once an option added later
    starts the same way. (IPython's parser takes no ``allow_abbrev`` argument.)"""

    def __call__(self, func):
        func = super().__call__(func)
        func.parser.allow_abbrev = False
        return func


def number(kind: Callable[[str], Any], words: str) -> Callable[[str], object]:
    """An option's type: argparse's own "invalid int value: '2.5'" does not say what is accepted."""
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {words}") from None
    return convert


WHOLE_NUMBER = number(int, "a whole number")


def int_or_float(text: str):
    """A number as typed: ``--interval 2`` is read back in a message as 2, not as 2.0."""
    try:
        return int(text)
    except ValueError:
        return float(text)


_GIVEN = "_given_once"  # where Once keeps the values given so far, until parse drops it


class Once(argparse.Action):
    """An option that takes one value, refused when given twice with two values: argparse
    kept the last of ``--preset fragmentation --preset reclaim`` and dropped the first
    without a word. The same value twice is harmless and accepted."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault(_GIVEN, {})
        earlier = given.get(self.dest, values)
        # nan != nan: a nan given once, or twice, is one value, left to the option's own check
        if earlier != values and not (earlier != earlier and values != values):
            raise argparse.ArgumentError(self, f"given twice ({earlier} and {values}); "
                                               f"give it once")
        given[self.dest] = values
        setattr(namespace, self.dest, values)


# A word that starts like a negative number ("-10%", "-1e3", "-.5"): a value, as no option
# starts with a digit. argparse reads only plain negative numbers as values: for the others it
# answered "expected one argument" instead of the option's own check ("cannot be negative").
_NEGATIVE = re.compile(r"-\.?\d")


def _values_attached(argv: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """``--headroom -10%`` as ``--headroom=-10%``, which argparse gives the option as its value;
    and each word so made -> the words as typed, for argparse's messages."""
    attached: List[str] = []
    typed: Dict[str, str] = {}
    for word in argv:
        option = attached[-1] if attached else ""
        takes_it = option.startswith("-") and "=" not in option and not _NEGATIVE.match(option)
        if takes_it and _NEGATIVE.match(word):
            attached[-1] = f"{option}={word}"
            typed[attached[-1]] = f"{option} {word}"
        else:
            attached.append(word)
    return attached, typed


def _without_comment(line: str) -> str:
    """The line up to a ``#`` that starts a word outside quotes, as a shell reads a comment:
    ``%alloc_conf expandable_segments=True  # fights fragmentation``, as the README writes its
    examples, is the setting alone; a ``#`` inside a word or quotes stays."""
    quote = None
    for index, char in enumerate(line):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            return line[:index]
    return line


def parse(magic: Any, line: str):  # a magic's method: magic_arguments gave it a ``parser``
    """The magic's options, with shell quoting understood: ``--headroom "10%"`` means 10%, and
    a trailing ``# comment`` ignored.

    IPython's own parse_argstring keeps the quotes in the values. Backslashes are not
    escapes here, so Windows paths (``--from C:\\logs\\gpu.csv``) pass through whole.
    """
    line = _without_comment(line)
    lexer = shlex.shlex(line, posix=True)
    lexer.whitespace_split, lexer.escape, lexer.commenters = True, "", ""
    try:
        argv, typed = _values_attached(list(lexer))
    except ValueError as error:  # an unclosed quote
        raise UsageError(f"{error.args[0][0].lower()}{error.args[0][1:]} in {line!r}") from None
    usage = " ".join(magic.parser.format_usage().split()[1:])
    accepted = f" (usage: {usage}; {usage.split()[0]}? explains each option)"
    for word in argv:
        option, separator, value = word.partition("=")
        if option.startswith("-") and separator and value == "--":
            # argparse hands ``--check=--`` to the option as an empty list, which no check expects
            raise UsageError(f"argument {option}: expected one argument, not --{accepted}")
    try:
        # intermixed: names and settings may follow an option (`%clear_cache a --quiet b`)
        args = magic.parser.parse_intermixed_args(argv)
    except UsageError as error:  # argparse says what was wrong; add what is accepted
        message = functools.reduce(lambda text, made: text.replace(*made), typed.items(), str(error))
        message += _quote_hint(magic.parser, argv, message)
        raise UsageError(message + accepted) from None
    vars(args).pop(_GIVEN, None)
    return args


def _quote_hint(parser, argv: List[str], message: str) -> str:
    """Where the words argparse refused follow a FILE option's value (``--from /tmp/my gpu.csv``),
    how to give a path with spaces: in quotes. "unrecognized arguments: gpu.csv" alone did not
    say that the path had been cut at its space."""
    prefix = "unrecognized arguments: "
    if not message.startswith(prefix):
        return ""
    refused = message[len(prefix):].split()
    files = {option for action in parser._actions if action.metavar == "FILE" for option in action.option_strings}
    for index, word in enumerate(argv):
        option, _, attached = word.partition("=")
        value = [attached] if attached else argv[index + 1:index + 2]
        after = index + 2 - bool(attached)
        if option in files and value and argv[after:after + len(refused)] == refused:
            return f"; a path with spaces goes in quotes: {option} \"{' '.join(value + refused)}\""
    return ""
