"""Each example is a folder of plain modules, run the way its README says.

pytest runs with ``--import-mode=importlib`` (no test folder on ``sys.path``), so put
each example folder there: ``import fastapi_app`` then works as it does under uvicorn.
Module names are unique across examples for that reason.
"""

from __future__ import annotations

import sys
from pathlib import Path

for folder in sorted(Path(__file__).parent.iterdir()):
    if folder.is_dir() and not folder.name.startswith((".", "_")):
        sys.path.insert(0, str(folder))
