"""torch's own warnings that a normal opgen compile would print, though they say nothing a user can act on.

- "`isinstance(treespec, LeafSpec)` is deprecated" (FutureWarning): torch.export's
  `run_decompositions` deep-copies torch's own tree specs (torch 2.13); once per compile.

It is silenced only while opgen exports a model, by a filter that matches its text, so every
other warning, torch's or the user's, still shows. (torch's "Failed to initialize NumPy" is not
opgen's: `import torch` itself prints it where NumPy is missing.)
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

TORCH_NOISE: tuple[tuple[str, type[Warning]], ...] = (
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
)


@contextlib.contextmanager
def torch_noise_silenced() -> Iterator[None]:
    with warnings.catch_warnings():
        for message, category in TORCH_NOISE:
            warnings.filterwarnings("ignore", message=message, category=category)
        yield
