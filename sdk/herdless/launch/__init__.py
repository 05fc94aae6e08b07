"""Real processes on loopback, for tests, demos and benchmarks: start, wait, stop.

- ``herdless.launch.servers``: ``herdless emulate`` and ``herdless serve`` as child
  processes on free ports of 127.0.0.1 (``emulator_process``, ``gateway_process``,
  ``ServerProcess``).
- ``herdless.launch.vllm``: a real vLLM on CPU: its venv and a small model prepared
  once in a cache folder, the server started and stopped by its pid, its metrics read
  (``python -m herdless.launch.vllm prepare | serve``).
- ``herdless.launch.vllm_pytest``: pytest fixtures for that vLLM (``vllm_server``,
  ``vllm_url``).

In this process they need the standard library and httpx (and pytest for the fixtures,
prometheus-client, imported when used, to read vLLM's metrics); vLLM, torch and
transformers live in the venv ``prepare`` makes. Test doubles (a fake clock, scripted
backends) are ``herdless.testing``, which imports nothing from here.
"""
