"""A rank's printed output as the cell shows it: whole lines, each prefixed with its rank.

Several ranks write at once, so a line is passed on only once it is whole: a line cut where
one read of the pipe ended would interleave with another rank's. A carriage return ends a
line too, so that a progress bar (tqdm's) moves as it draws instead of appearing at the end.
"""
from __future__ import annotations

import codecs
import re
from typing import List

__all__ = ["RankLines", "prefix"]

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\n|\r)")


def prefix(rank: int) -> str:
    return f"[rank {rank}] "


class RankLines:
    """Bytes a rank wrote to one stream in, its whole lines out with the prefix."""

    def __init__(self, rank: int):
        self.prefix = prefix(rank)
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""

    def feed(self, data: bytes) -> str:
        """The lines ``data`` completes, prefixed; the rest waits for the next call."""
        text = self._partial + self._decoder.decode(data)
        lines: List[str] = []
        end = 0
        for match in _LINE.finditer(text):
            if match.group().endswith("\r") and match.end() == len(text):
                break  # perhaps the first half of \r\n: the next read says
            lines.append(self.prefix + match.group())
            end = match.end()
        self._partial = text[end:]
        return "".join(lines)

    def end(self) -> str:
        """What is left when the stream ends, as a last line."""
        text = self._partial + self._decoder.decode(b"", final=True)
        self._partial = ""
        if not text:
            return ""
        return self.prefix + text + ("" if text.endswith(("\n", "\r")) else "\n")
