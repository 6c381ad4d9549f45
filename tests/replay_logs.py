"""Large --query-gpu logs grown from a real one, for the tests and benchmarks/replay_large.py.

`nvidia-smi --query-gpu=... --format=csv -l 1 > gpu.csv` left running for days gives a log of
hundreds of MB; the recordings in tests/data are a few minutes of one. A grown log is the real
log's rows again and again, each copy's timestamps moved on by the log's span, so that it reads
as one long run of the same GPUs.
"""
from __future__ import annotations

import datetime
import pathlib

from colab_gpu.devices.replay.values import epoch

# The timestamp layouts of the real logs, as strftime writes them (milliseconds cut after).
_LAYOUTS = {"Z": "%Y-%m-%dT%H:%M:%S.%f", "/": "%Y/%m/%d %H:%M:%S.%f"}


def _layout(stamp: str) -> str:
    if stamp.endswith("Z"):
        return "Z"
    if "/" in stamp:
        return "/"
    raise ValueError(f"no layout for the timestamp {stamp!r}: use a log of another")


def _written(seconds: float, layout: str) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime(_LAYOUTS[layout])[:-3] + ("Z" if layout == "Z" else "")


def grow_log(source: pathlib.Path, target: pathlib.Path, size: int) -> int:
    """Write the log ``source`` (with a header and a timestamp first on each row) to ``target``
    again and again, until ``target`` holds ``size`` bytes; the rows written."""
    header, *rows = source.read_text().splitlines()
    cells = [row.split(",", 1) for row in rows]
    layout = _layout(cells[0][0].strip())
    stamps = [epoch(stamp) for stamp, _ in cells]
    steps = sorted({later - earlier for earlier, later in zip(stamps, stamps[1:]) if later > earlier})
    span = stamps[-1] - stamps[0] + steps[0]  # the next copy starts one step after this one ends
    written, count, copy = 0, 0, 0
    with target.open("w", encoding="utf-8", newline="\n") as out:
        out.write(header + "\n")
        while written < size:
            shifted = {stamp: _written(stamp + copy * span, layout) for stamp in set(stamps)}
            for stamp, (_, rest) in zip(stamps, cells):
                line = f"{shifted[stamp]},{rest}\n"
                out.write(line)
                written += len(line)
                count += 1
                if written >= size:
                    break
            copy += 1
    return count
