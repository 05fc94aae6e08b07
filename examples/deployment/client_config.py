"""A herdless client for several GPU servers, each behind its own gateway.

``GPU_GATEWAYS`` lists the gateways (comma-separated API roots); the fallback comes
from ``HERDLESS_FALLBACK_URL`` / ``_API_KEY`` / ``_MODEL``. Each call picks the less
busy of two gateways and skips any whose breaker is open or that is draining.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import herdless


def gateways(value: str) -> list[herdless.Backend]:
    """``"http://gpu-0.gpu:8080/v1,http://gpu-1.gpu:8080/v1"`` as backends gpu-0, gpu-1."""
    urls = [url.strip() for url in value.split(",") if url.strip()]
    if not urls:
        raise ValueError("GPU_GATEWAYS needs at least one URL")
    return [herdless.Backend(name=f"gpu-{i}", base_url=url) for i, url in enumerate(urls)]


def build_client(env: Mapping[str, str] = os.environ, **options: Any) -> herdless.Client:
    fallback = []
    if env.get("HERDLESS_FALLBACK_URL"):
        fallback.append(
            herdless.Backend(
                name="hosted",
                base_url=env["HERDLESS_FALLBACK_URL"],
                api_key=env.get("HERDLESS_FALLBACK_API_KEY"),
                model=env["HERDLESS_FALLBACK_MODEL"],
                external=True,
            )
        )
    return herdless.Client(
        primary=gateways(env["GPU_GATEWAYS"]),
        model=env.get("HERDLESS_MODEL"),
        fallback=fallback,
        deadline=float(env.get("HERDLESS_DEADLINE", "20")),
        **options,
    )
