"""Deprecated: moved to :mod:`herdless.launch.vllm`; this alias will be removed.

``herdless.testing`` keeps the test doubles; starting processes lives in
``herdless.launch``. Importing this module warns (``DeprecationWarning``) and gives
the same objects as the new one.
"""

from __future__ import annotations

import warnings

from herdless.launch.vllm import *  # noqa: F403 -- the alias re-exports the whole module
from herdless.launch.vllm import __all__ as __all__
from herdless.launch.vllm import main

warnings.warn(
    "herdless.testing.vllm moved to herdless.launch.vllm; import it from there",
    DeprecationWarning,
    # Run as a command, the warning is the command's own (shown by default); imported,
    # it is the importer's.
    stacklevel=1 if __name__ == "__main__" else 2,
)

if __name__ == "__main__":
    raise SystemExit(main())
