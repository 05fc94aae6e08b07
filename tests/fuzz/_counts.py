"""How many fuzz cases ran, by family, and what the hostile connections got: printed at the end.

``COUNTS``: cases by family (the report's numbers). ``OUTCOMES``: over the raw-socket
probes of ``test_gateway_connections.py``, how many there were, the 5xx answers seen,
the connections the gateway never closed (hung) and those closed past their limit (late).
"""

from __future__ import annotations

from collections import Counter

COUNTS: Counter[str] = Counter()
OUTCOMES: Counter[str] = Counter()
