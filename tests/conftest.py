"""Session-wide: one intra-op thread per process, as `verl-bridge train` uses on CPU.

The models here are tiny (hidden 64): OpenMP threads cost more than they give, and on the 2-core CI
machine, with torchrun ranks and background installs sharing the cores, spinning threads slowed a
quickstart run from 9 s to 68 s of CPU (measured with OMP_NUM_THREADS=1 vs 2, same rewards). Set in
the environment too, so every launched process (torchrun ranks, `verl-bridge train`) inherits it.
"""

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
