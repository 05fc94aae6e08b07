"""Deprecated: moved to :mod:`herdless.launch.servers`; this alias will be removed.

``herdless.testing`` keeps the test doubles; starting processes lives in
``herdless.launch``. Importing this module warns (``DeprecationWarning``) and gives
the same objects as the new one.
"""

from __future__ import annotations

import warnings

from herdless.launch.servers import *  # noqa: F403 -- the alias re-exports the whole module
from herdless.launch.servers import __all__ as __all__

warnings.warn(
    "herdless.testing.servers moved to herdless.launch.servers; import it from there",
    DeprecationWarning,
    stacklevel=2,
)
