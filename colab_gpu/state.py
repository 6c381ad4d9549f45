"""What the extension keeps for the life of the kernel, in one place: :data:`session`.

Everything else is recomputed at each call. A module reads and writes its part here rather
than in a module global, so that what a kernel remembers between cells is written down once
and a test can put it back with :meth:`Session.reset` instead of reaching into modules.
Core: a feature's objects (a sampler, a server, a widget) are typed ``Any``.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    from .cuda_order import Device
    from .devices import DeviceSource

__all__ = ["Session", "session"]


@dataclasses.dataclass(eq=False)
class Session:
    """The kernel's state; each field's default is its value after a fresh import."""

    # cuda_order: (CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER, the GPUs' ids) -> the driver's
    # devices (None when it could not say) and, for a failure, the conditions it failed under:
    # one child process per setting, however often the card or monitor asks. The lock makes
    # two threads (the notebook, the live sampler) ask once.
    driver_answers: Dict[tuple, Tuple[Optional[Tuple[Device, ...]], Optional[tuple]]] = \
        dataclasses.field(default_factory=dict)
    driver_asking: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    # torch_view: CUDA_VISIBLE_DEVICES as last seen before this process's CUDA started
    # ("before") and as first seen after ("started"). torch_view's import takes its first look.
    visible_seen: Dict[str, Optional[str]] = dataclasses.field(default_factory=dict)

    # allocator: the setting (as written to the environment) last given to torch's run-time
    # setter; from that call on, torch holds its settings and never reads the variables again.
    given_to_torch: Optional[str] = None

    # devices: the process's one live NVML source, opened on first use, closed at exit.
    default_source: Optional[DeviceSource] = None

    # live: the running sampler or the last one (for history()), the live page's server, what
    # the next stop() also ends (on_stop), and the lock that guards the three.
    live_sampler: Any = None  # a live.sampler.Sampler
    live_server: Any = None  # a live.server.LiveServer
    live_cleanups: List[Callable[[], None]] = dataclasses.field(default_factory=list)
    live_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    # live.widget: (sampler, its widget): a second --live shows the same widget again
    live_shown: Any = None

    def reset(self, *names: str) -> None:
        """Put the named fields (all when none is named) back as after a fresh import, before
        torch_view's first look. Stops and closes nothing (a sampler, a source): for tests."""
        fields = {field.name: field for field in dataclasses.fields(self)}
        for name in names or tuple(fields):
            field = fields[name]  # KeyError: no such field
            fresh = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
            setattr(self, name, fresh)


session = Session()
