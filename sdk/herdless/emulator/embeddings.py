"""``POST /v1/embeddings``: deterministic, emulated embeddings in vLLM's response shape.

The shape follows vLLM's ``EmbeddingResponse`` (not a capture): ``object: "list"``,
one ``{"index", "object": "embedding", "embedding"}`` per input, and ``usage`` with
``completion_tokens: 0``. ``encoding_format`` ``float`` (default) or ``base64``
(little-endian float32, what the openai client asks for by default).

Emulated, not modelled: the vector is a unit vector drawn from a seed made of the
input's text (the same input, the same vector), of ``dimensions`` (default
``DIMENSIONS``) floats, and the answer comes at once, outside the engine's batch: the
emulator serves a generative model, and the point of this route is the wire format
and the token count for the gateway in front.
"""

from __future__ import annotations

import base64
import math
import random
import secrets
import struct
import time
import zlib
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from herdless.emulator import text, wire
from herdless.emulator.responses import json_response
from herdless.emulator.state import EmulatorState

__all__ = ["DIMENSIONS", "EmbeddingRequest", "embeddings", "vector"]

DIMENSIONS = 384
"""Floats per vector unless the request asks for ``dimensions`` (a small embedding model's)."""


class EmbeddingRequest(BaseModel):
    """The fields of an embedding request the emulator acts on; others are accepted."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]] = Field(min_length=1)
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1, le=8192)

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text, or a list of token ids."""
        value = self.input
        if isinstance(value, str):
            return [value]
        ids = [item for item in value if isinstance(item, int)]
        if len(ids) == len(value):
            return [ids]  # one input given as token ids
        return [item for item in value if not isinstance(item, int)]


def vector(item: str | list[int], dimensions: int) -> list[float]:
    """The emulated embedding of one input: a unit vector, the same for the same input."""
    key = item if isinstance(item, str) else ",".join(map(str, item))
    rng = random.Random(zlib.crc32(key.encode()))
    raw = [rng.gauss(0.0, 1.0) for _ in range(dimensions)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _tokens(item: str | list[int]) -> int:
    return max(1, text.count_tokens(item)) if isinstance(item, str) else len(item)


async def embeddings(request: Request) -> Response:
    """``POST /v1/embeddings``."""
    state: EmulatorState = request.app.state.emulator
    try:
        req = EmbeddingRequest.model_validate_json(await request.body())
    except ValidationError as exc:
        return json_response(wire.schema_error(exc), 400)
    served = state.settings.model
    if req.model is not None and req.model != served:
        message = f"The model `{req.model}` does not exist. Valid aliases: {served}."
        return json_response(wire.error_body(message, "NotFoundError", 404, "model"), 404)
    items = req.inputs()
    counts = [_tokens(item) for item in items]
    limit = state.settings.max_model_len
    for index, count in enumerate(counts):
        if count > limit:
            message = (
                f"This model's maximum context length is {limit} tokens. However, input "
                f"{index} has {count} tokens. Please reduce the length of the input."
            )
            return json_response(wire.error_body(message, "BadRequestError", 400, "input"), 400)
    if state.faults.should_fail(state.rng):
        status = state.faults.error_status
        return json_response(
            wire.error_body("Injected fault.", "InternalServerError", status), status
        )
    dimensions = req.dimensions or DIMENSIONS
    data = []
    for index, item in enumerate(items):
        floats = vector(item, dimensions)
        encoded: list[float] | str = floats
        if req.encoding_format == "base64":
            encoded = base64.b64encode(struct.pack(f"<{len(floats)}f", *floats)).decode()
        data.append({"index": index, "object": "embedding", "embedding": encoded})
    prompt = sum(counts)
    body = {
        "id": f"embd-{secrets.token_hex(8)}",
        "object": "list",
        "created": int(time.time()),
        "model": served,
        "data": data,
        "usage": {
            "prompt_tokens": prompt,
            "total_tokens": prompt,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }
    return json_response(wire.dumps(body))
