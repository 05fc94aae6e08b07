"""An emulated vLLM server for machines without a GPU (``herdless emulate``).

Modules: ``engine`` (the pure timing model: steps on a timeline, its defaults and
formula in its docstring), ``scheduler`` (what a step runs: vLLM V1's token budget,
chunked prefill, FCFS admission, preemption), ``kvcache`` (KV blocks),
``sequence`` (one request's generation), ``driver`` (runs the engine on the event loop),
``text`` (tokenisation rule, deterministic answers), ``wire`` (vLLM's JSON and
SSE), ``faults``, ``metrics``, ``settings`` (``HERDLESS_EMULATOR_*``), ``state``
(what one server holds), ``app`` (routes), ``completions`` (the generation routes),
``embeddings`` (``/v1/embeddings``, emulated vectors),
``responses`` (a JSON body or an SSE stream that waits on a sequence), ``server``
(uvicorn, the loading delay, the listening socket) and ``cli``. They need the
``server`` extra (starlette, uvicorn). See ``docs/emulator.md``.
"""
