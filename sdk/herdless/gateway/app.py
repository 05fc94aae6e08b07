"""The gateway's Starlette application: routes only.

Routes: the admitted ``POST`` routes (:data:`~herdless.gateway.routes.ROUTES`, served by
:mod:`herdless.gateway.proxy`), ``GET /v1/models`` (authenticated like chat, shared and
cached: :mod:`herdless.gateway.models`), ``GET /healthz``, ``/readyz`` and ``/metrics``,
``POST /admin/drain``, ``/admin/resume`` and ``/admin/reload`` (audited on
``herdless.gateway.audit``; the reload is :mod:`herdless.gateway.reload`). Any other path,
a trailing slash included, is a JSON 404 (405 for a known path and another method): never
a redirect, whose ``Location`` would be built from the client's ``Host`` header. A 404
under ``/v1/`` names the routes the gateway serves. Browser pages reach ``/v1/`` through
:mod:`herdless.gateway.cors`. What is logged is in :mod:`herdless.gateway.logs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Callable

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from herdless._clock import SYSTEM_CLOCK, Clock
from herdless.gateway.asgi import GatewayApp
from herdless.gateway.core.admission import Admission
from herdless.gateway.cors import CrossOrigin
from herdless.gateway.gate import Gate
from herdless.gateway.logs import LOG, effective_config, event
from herdless.gateway.metrics import CONTENT_TYPE, GatewayMetrics
from herdless.gateway.models import ModelList
from herdless.gateway.proxy import AdmittedProxy
from herdless.gateway.reload import HEALTH_CONNECTIONS, ConfigError, Reloader, SettingsLayers
from herdless.gateway.routes import ROUTES
from herdless.gateway.runtime import KEY_REQUIRED, Runtime, audit, request_id
from herdless.gateway.settings import GatewaySettings, digest_matches, secret_digest
from herdless.gateway.sleep import Sleeper
from herdless.gateway.spill import Spill
from herdless.gateway.upstream import SLOW, Upstream, UpstreamUnavailable
from herdless.gateway.watcher import Watcher
from herdless.gateway.wire import error_body, refusal_headers

__all__ = ["create_app"]

_SLOW_POLLS = 3  # health polls in a row without an answer before the upstream counts as down
_OUT_POLL = 0.25  # seconds between health polls at most while the upstream is out
_MAX_EXPECT = 86_400  # seconds: a maintenance window announced longer is a typo
_PATH_SHOWN = 100  # characters of an unknown path echoed in a 404 (error bodies are cached)
_SERVED = ", ".join(f"POST {route.path}" for route in ROUTES) + " and GET /v1/models"


def create_app(
    settings: GatewaySettings | None = None,
    *,
    clock: Clock = SYSTEM_CLOCK,
    transport: httpx.AsyncBaseTransport | None = None,
    fallback_transport: httpx.AsyncBaseTransport | None = None,
    layers: SettingsLayers | None = None,
) -> Starlette:
    """Build a gateway app; its parts live on ``app.state.runtime`` (the engine
    watcher, when the gateway sizes itself, on ``app.state.watcher``; what reloads the
    settings on ``app.state.reloader``; what puts the engine to sleep, with
    ``upstream_sleep``, on ``app.state.sleeper``).

    Args:
        settings: the gateway's settings (default: from the environment).
        clock: the admission clock (tests inject a fake one).
        transport: httpx transport to the upstream (tests inject an in-process one).
        fallback_transport: httpx transport to the hosted fallback (tests).
        layers: where ``settings`` came from, for a reload (default: what ``settings``
            set explicitly counts as flags, over the file ``settings.config``, read here).

    Raises:
        ConfigError: the settings file is invalid (its line and field named).
        PolicyError: the key policy file is invalid (its line and field named).
    """
    settings = settings or GatewaySettings()
    if layers is None:
        given = {n: getattr(settings, n) for n in settings.model_fields_set if n != "config"}
        layers = SettingsLayers(flags=given, file=settings.config)
        if settings.config is not None:
            settings = layers.read()  # the file, under what was set explicitly
    shown = effective_config(settings)  # while the secrets are here to say "set"
    runtime = _runtime(settings, clock, transport, fallback_transport)
    watcher = None
    if settings.sizing == "engine":
        watcher = Watcher(
            runtime.upstream, runtime.gate, interval=settings.metrics_interval, now=clock.monotonic
        )
    reloader = Reloader(runtime, layers, settings)
    sleeper = None
    if (idle := settings.upstream_sleep) is not None:
        sleeper = Sleeper(runtime.upstream, runtime.gate, idle=idle, now=clock.monotonic)
    routes = _Routes(
        runtime, ModelList(runtime.upstream, ttl=settings.models_cache_ttl, clock=clock), reloader
    )
    admitted = {r.path: AdmittedProxy(runtime, r) for r in ROUTES}
    app = GatewayApp(
        routes=routes.table(admitted),
        direct=admitted,  # a POST from no web page skips Starlette's stack (gateway.asgi)
        exception_handlers={404: routes.not_found, 405: routes.not_allowed},
        lifespan=_lifespan(runtime, watcher, shown, sleeper),
    )
    # Starlette answers "/healthz/" with a 307 to a URL built from the Host header: an open
    # redirect that a client following it would send its body (and key) through.
    app.router.redirect_slashes = False
    app.add_middleware(CrossOrigin, origins=lambda: runtime.settings.allowed_origins)
    app.state.runtime = runtime
    app.state.watcher = watcher
    app.state.reloader = reloader
    app.state.sleeper = sleeper
    return app


def _runtime(
    settings: GatewaySettings,
    clock: Clock,
    transport: httpx.AsyncBaseTransport | None,
    fallback_transport: httpx.AsyncBaseTransport | None = None,
) -> Runtime:
    """The gateway's parts: the gate over its admission core, the upstream pool, metrics,
    the key policies and the hosted fallback.

    Raises:
        PolicyError: the key policy file is invalid.
    """
    policies = settings.policies()
    gate = Gate(Admission(settings.admission_config(), clock=clock, keys=policies.limits()))
    cap = settings.max_concurrency  # no cap: the admission bounds the pool
    spill = None
    if settings.fallback_url is not None:
        assert settings.fallback_model is not None  # the settings require it
        spill = Spill(
            str(settings.fallback_url).rstrip("/"),
            settings.fallback_model,
            settings.fallback_api_key,
            policies.fallback,
            transport=fallback_transport,
        )
    spilling = sorted(name for name, policy in policies.keys.items() if policy.fallback)
    if policies.default.fallback:
        spilling.insert(0, "defaults")
    if spilling and spill is None:
        event(LOG, logging.WARNING, "key policies allow a fallback but no --fallback-url is set: "
              "their requests are held or refused", keys=",".join(spilling))  # fmt: skip
    return Runtime(
        settings=settings.without_secrets(),
        gate=gate,
        upstream=Upstream(
            str(settings.upstream),
            api_key=settings.upstream_api_key,
            max_connections=None if cap is None else cap + HEALTH_CONNECTIONS,
            connect_timeout=settings.connect_timeout,
            read_timeout=settings.read_timeout,
            transport=transport,
        ),
        metrics=GatewayMetrics(
            gate.gauges,
            fairness=gate.fairness,
            sizing=gate.sizing_figures,
            top=settings.metrics_top_users,
        ),
        keys=settings.api_key_table(named=policies.secrets),
        users=settings.user_ids(),
        admin_digest=None if settings.admin_token is None else secret_digest(settings.admin_token),
        policies=policies.without_secrets(),
        spill=spill,
    )


def _lifespan(
    runtime: Runtime, watcher: Watcher | None, shown: dict[str, object], sleeper: Sleeper | None
) -> Callable[[Starlette], contextlib.AbstractAsyncContextManager[None]]:
    """Start: log the config, poll the upstream's health (and read its metrics) once,
    then keep polling; stop: the tasks, the pool, and a line saying how it ended."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        event(LOG, logging.INFO, "config", **shown)
        await _poll_once(runtime)  # know the upstream's state before the first request
        tasks = [asyncio.create_task(_poll_forever(runtime))]
        if watcher is not None:
            await watcher.read_once()  # sized before the first request where it can be
            tasks.append(asyncio.create_task(watcher.run()))
        if sleeper is not None:
            tasks.append(asyncio.create_task(sleeper.run()))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await runtime.upstream.aclose()
            if runtime.spill is not None:
                await runtime.spill.aclose()
            status = runtime.gate.status()
            del status["ready"], status["upstream_ready"]
            event(LOG, logging.INFO, "stopped", **status)

    return lifespan


class _Routes:
    """The routes: the admitted ones (given), health, metrics, models, admin, the 404s."""

    def __init__(self, runtime: Runtime, model_list: ModelList, reloader: Reloader) -> None:
        self._rt = runtime
        self._models = model_list
        self._reloader = reloader

    def table(self, admitted: dict[str, AdmittedProxy]) -> list[Route]:
        return [
            *(Route(path, proxy, methods=["POST"]) for path, proxy in admitted.items()),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/readyz", self.readyz, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/admin/drain", self.drain, methods=["POST"]),
            Route("/admin/resume", self.resume, methods=["POST"]),
            Route("/admin/reload", self.reload, methods=["POST"]),
        ]

    async def healthz(self, request: Request) -> Response:
        return _json(200, {"status": "ok"})

    async def readyz(self, request: Request) -> Response:
        gate = self._rt.gate
        return _json(200 if gate.admission.ready else 503, gate.status())

    async def metrics(self, request: Request) -> Response:
        return Response(self._rt.metrics.render(), media_type=CONTENT_TYPE)

    async def models(self, request: Request) -> Response:
        headers = dict(request.headers)
        rid = request_id(headers)
        echo = {"x-request-id": rid}
        if self._rt.identify(headers) is None:
            body = error_body(KEY_REQUIRED, code="invalid_api_key", type="authentication_error")
            echo["www-authenticate"] = "Bearer"
            return Response(body, 401, echo, media_type="application/json")
        try:
            answer = await self._models.get(rid)
        except UpstreamUnavailable as exc:
            refused = self._rt.gate.admission.unavailable(exc.code, str(exc))
            body = error_body(refused.message, code=refused.code, type="service_unavailable")
            for name, value in refusal_headers(refused):
                echo[name.decode()] = value.decode()
            return Response(body, 503, echo, media_type="application/json")
        return Response(answer.body, answer.status, echo, media_type=answer.content_type)

    async def drain(self, request: Request) -> Response:
        """``POST /admin/drain[?expect=SECONDS]``: ``expect`` announces the window's length:
        refusals then name its end, and requests whose hold outlasts it wait for it."""

        def act() -> dict[str, object] | Response:
            expect = _seconds(request, "expect")
            if isinstance(expect, Response):
                return expect
            return {"refused_waiting": self._rt.gate.drain(expect), "expect": expect}

        return self._admin(request, "drain", act)

    async def resume(self, request: Request) -> Response:
        """``POST /admin/resume[?load_time=SECONDS]``: ``load_time``, what the upstream took
        to load as measured by ``herdless maintain``, is what the next outage promises."""

        def act() -> dict[str, object] | Response:
            load = _seconds(request, "load_time")
            if isinstance(load, Response):
                return load
            admission = self._rt.gate.admission
            if load is not None:
                admission.load_time = load
            if admission.draining:  # those waiting now were held through the window
                self._rt.metrics.drain_held += admission.queue_depth
            self._rt.gate.resume()
            return {} if load is None else {"load_time": load}

        return self._admin(request, "resume", act)

    async def reload(self, request: Request) -> Response:
        """``POST /admin/reload``: re-read the settings file and the key policies (as
        ``SIGHUP``); 200 with what changed and what did not, or 400 naming the field."""
        report: dict[str, object] = {}

        def act() -> dict[str, object] | Response:
            try:
                done = self._reloader.reload()
            except ConfigError as exc:
                return _json_error(400, "invalid_config", str(exc))
            report.update(done.as_dict())
            return {"changed": ",".join(sorted(done.changed)) or "nothing"}

        answer = self._admin(request, "reload", act)
        if answer.status_code == 200:
            return _json(200, {**self._rt.gate.status(), **report})
        return answer

    def _admin(
        self, request: Request, action: str, act: Callable[[], dict[str, object] | Response]
    ) -> Response:
        """Authorize, act, audit; ``act`` returns what it did, or the error it answers."""
        rid = request_id(dict(request.headers))
        denied = _deny_admin(request, self._rt.admin_digest)
        if denied is not None:
            audit(action, f"denied {denied.status_code}", request.scope, rid)
            return denied
        did = act()
        if isinstance(did, Response):
            audit(action, f"refused {did.status_code}", request.scope, rid)
            return did
        audit(action, "done", request.scope, rid, inflight=self._rt.gate.admission.inflight, **did)
        return _json(200, self._rt.gate.status())

    async def not_found(self, request: Request, exc: Exception) -> Response:
        path = request.url.path[:_PATH_SHOWN]
        message = f"no route {request.method} {path}"
        if path.startswith("/v1/"):
            message += f"; this gateway serves {_SERVED}"
        return _json_error(404, "not_found", message)

    async def not_allowed(self, request: Request, exc: Exception) -> Response:
        return _json_error(405, "method_not_allowed", f"{request.method} is not allowed here")


async def _poll_once(runtime: Runtime, slow_in_a_row: int = 0) -> int:
    """One health poll; returns how many polls in a row have now timed out.

    A refusal or a non-200 is believed at once. A timeout is believed only after
    ``_SLOW_POLLS`` in a row: under a flood the gateway's own loop can be late to read a
    healthy answer, and one late poll must not turn every request into a 503.
    """
    code = await runtime.upstream.health()
    if code == SLOW:
        slow_in_a_row += 1
        if slow_in_a_row >= _SLOW_POLLS:
            runtime.gate.set_upstream(ready=False, code="upstream_unavailable")
        return slow_in_a_row
    runtime.gate.set_upstream(ready=code is None, code=code or "upstream_loading")
    return 0


async def _poll_forever(runtime: Runtime) -> None:
    """Poll every ``health_interval``; closer together while the upstream is out, so that
    its load time is measured to a quarter of a second."""
    slow = 0
    while True:
        interval = runtime.settings.health_interval
        if not runtime.gate.admission.upstream_ready:
            interval = min(interval, _OUT_POLL)
        await asyncio.sleep(interval)
        slow = await _poll_once(runtime, slow)


def _deny_admin(request: Request, admin_digest: bytes | None) -> Response | None:
    if admin_digest is None:  # first: no token could help, so do not ask for one
        return _json_error(
            403,
            "admin_disabled",
            "admin is off on this gateway: set HERDLESS_GATEWAY_ADMIN_TOKEN and restart it "
            "to use /admin/drain, /admin/resume and /admin/reload",
        )
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token:
        response = _json_error(401, "invalid_admin_token", "an admin bearer token is required")
        response.headers["www-authenticate"] = "Bearer"
        return response
    if not digest_matches(token.strip(), admin_digest):
        return _json_error(403, "invalid_admin_token", "the admin token is not valid")
    return None


def _seconds(request: Request, name: str) -> float | Response | None:
    """Query parameter ``name`` as seconds in (0, _MAX_EXPECT], None if absent, else a 400."""
    text = request.query_params.get(name)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if 0 < value <= _MAX_EXPECT:
        return value
    message = f"{name} must be seconds in (0, {_MAX_EXPECT}], got {text[:40]!r}"
    return _json_error(400, "invalid_request", message)


def _json(status: int, body: dict[str, object]) -> Response:
    return Response(json.dumps(body), status, media_type="application/json")


def _json_error(status: int, code: str, message: str) -> Response:
    body = error_body(message, code=code, type="invalid_request_error")
    return Response(body, status, media_type="application/json")
