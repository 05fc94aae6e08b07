"""An emulated vLLM server for machines without a GPU (``herdless emulate``).

Modules: ``engine`` (the pure scheduler and timing model, its defaults and
formula in its docstring), ``driver`` (runs the engine on the event loop),
``text`` (tokenisation rule, deterministic answers), ``wire`` (vLLM's JSON and
SSE), ``faults``, ``metrics``, ``settings`` (``HERDLESS_EMULATOR_*``), ``app``
(routes), ``server`` (uvicorn, the loading delay, the listening socket) and
``cli``. See ``docs/emulator.md``.
"""
