"""An emulated vLLM server for machines without a GPU (``herdless emulate``).

Modules: ``engine`` (the pure scheduler and timing model, its defaults and
formula in its docstring), ``driver`` (runs the engine on the event loop),
``text`` (tokenisation rule, deterministic answers), ``wire`` (vLLM's JSON and
SSE), ``faults``, ``metrics``, ``settings`` (``HERDLESS_EMULATOR_*``), ``state``
(what one server holds), ``app`` (routes), ``completions`` (the generation routes),
``embeddings`` (``/v1/embeddings``, emulated vectors),
``responses`` (a JSON body or an SSE stream that waits on a sequence), ``server``
(uvicorn, the loading delay, the listening socket) and ``cli``. They need the
``server`` extra (starlette, uvicorn). See ``docs/emulator.md``.
"""
