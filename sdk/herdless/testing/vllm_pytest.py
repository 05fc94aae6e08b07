"""Deprecated: moved to :mod:`herdless.launch.vllm_pytest`; this alias will be removed.

``herdless.testing`` keeps the test doubles; starting processes lives in
``herdless.launch``. Importing this module warns (``DeprecationWarning``) and gives
the same objects as the new one.
"""

from __future__ import annotations

import warnings

from herdless.launch.vllm_pytest import *  # noqa: F403 -- the alias re-exports the whole module
from herdless.launch.vllm_pytest import __all__ as __all__

warnings.warn(
    "herdless.testing.vllm_pytest moved to herdless.launch.vllm_pytest; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
