"""``colab_gpu.launch``: torch.distributed from a notebook cell, one process per GPU.

Layers: ``launcher`` plans the run (how many ranks, which backend, whether CUDA has started
here) and forks and watches the ranks; ``rank`` is each forked process's side; ``output``
prefixes what the ranks print; ``cuda_state`` tells whether CUDA started in this process
without starting it. Nothing here imports torch or IPython at import time.

(A package named ``distributed``, not ``launch``: importing a subpackage sets it as an
attribute of its parent, where it would hide the function ``colab_gpu.launch``.)
"""
from __future__ import annotations

from .failures import LaunchOptionError, LaunchRefused, LaunchTimeout, RankError, RankTraceback
from .launcher import launch

__all__ = ["launch", "RankError", "RankTraceback", "LaunchTimeout", "LaunchOptionError", "LaunchRefused"]
