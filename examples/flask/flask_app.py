"""A Flask app on one shared herdless.Client, as a Flask extension.

Run it (configuration from HERDLESS_*)::

    flask --app examples/flask/flask_app.py run --port 5000
"""

from __future__ import annotations

import atexit
import json
from collections.abc import Iterator
from typing import Any

from flask import Flask, Response, current_app, jsonify, request, stream_with_context

import herdless


class Herdless:
    """The extension: one ``herdless.Client`` per app, shared by every request thread.

    ``herdless.Client`` is thread-safe; sharing it is the point: its breaker,
    backpressure window and retry budget protect the GPU for the whole process.
    """

    def __init__(self, app: Flask | None = None) -> None:
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, **client_options: Any) -> None:
        """Create the app's client; without options it reads ``HERDLESS_*``."""
        client = herdless.Client(**client_options)
        app.extensions["herdless"] = client
        # Flask has no "app stopped" signal: close the connections at interpreter exit.
        atexit.register(client.close)

    @property
    def client(self) -> herdless.Client:
        client: herdless.Client = current_app.extensions["herdless"]
        return client


llm = Herdless()


def _headers(answer: Any) -> dict[str, str]:
    headers = {
        "x-herdless-backend": answer.backend,
        "x-herdless-attempts": str(len(answer.attempts)),
        "x-request-id": answer.request_id,
    }
    if answer.fallback_reason:
        headers["x-herdless-fallback-reason"] = answer.fallback_reason
    return headers


def create_app(**client_options: Any) -> Flask:
    app = Flask(__name__)
    llm.init_app(app, **client_options)

    @app.errorhandler(herdless.HerdlessError)
    def unavailable(exc: herdless.HerdlessError) -> tuple[Response, int]:
        return jsonify(error=type(exc).__name__, message=exc.message), 503

    @app.post("/chat")
    def chat() -> Response:
        body = request.get_json(force=True)
        result = llm.client.chat(
            [{"role": "user", "content": body["message"]}],
            allow_fallback=not body.get("private", False),
        )
        response = jsonify(answer=result.content)
        response.headers.update(_headers(result))
        return response

    @app.post("/chat/stream")
    def chat_stream() -> Response:
        body = request.get_json(force=True)
        # Returns after the first chunk: errors before any text are still HTTP errors.
        stream = llm.client.chat([{"role": "user", "content": body["message"]}], stream=True)

        @stream_with_context  # keeps the request context alive while the body streams
        def events() -> Iterator[str]:
            try:
                with stream:
                    for chunk in stream:
                        if chunk.content:
                            yield f"data: {json.dumps({'delta': chunk.content})}\n\n"
            except herdless.StreamInterrupted as exc:
                yield f"event: error\ndata: {json.dumps({'delivered': exc.delivered_chars})}\n\n"
                return
            yield "data: [DONE]\n\n"

        return Response(events(), mimetype="text/event-stream", headers=_headers(stream))

    return app
