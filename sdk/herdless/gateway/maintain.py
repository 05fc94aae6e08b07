"""``herdless maintain``: one command for a maintenance window on the one GPU.

``herdless maintain --gateway URL --upstream URL [--expect SECONDS] -- COMMAND...``

1. drain the gateway, announcing the window's expected length (``--expect``, else the
   load time the gateway last measured): requests whose hold outlasts it wait, the
   others get ``503 draining`` with the time left (and spill where their key may);
2. wait until nothing runs upstream (at most ``--drain-timeout``; a progress line a
   second);
3. run ``COMMAND`` (restart vLLM with new flags or weights);
4. wait until the upstream is ready and answers one probe request sent to it directly
   (the model from its ``/v1/models``), at most ``--ready-timeout``;
5. resume, telling the gateway the load time measured (command start to ready): its
   next outage promises that.

A command that fails resumes on the old upstream if it still answers; else the gateway
stays drained and the command says so. The last lines report the window's length and
the requests held, spilled and refused during it (the gateway's own counters). The exit
status says whether the change went in: 0 yes, 1 no, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TextIO

import httpx
from pydantic import AnyHttpUrl, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from herdless._cli_settings import SettingsCommand, exit_status, fail

__all__ = ["MaintainSettings", "MaintenanceReport", "help_text", "main", "maintain"]

_POLL = 0.25  # seconds between two looks at the gateway or the upstream
_PROBE = "Reply with one word."


class MaintainSettings(BaseSettings):
    """Settings of ``herdless maintain``; each field is ``HERDLESS_MAINTAIN_<NAME>`` or a flag."""

    model_config = SettingsConfigDict(
        env_prefix="HERDLESS_MAINTAIN_", extra="forbid", use_attribute_docstrings=True
    )

    gateway: AnyHttpUrl = AnyHttpUrl("http://127.0.0.1:8080")
    """the gateway's base URL (herdless serve)"""
    upstream: AnyHttpUrl = AnyHttpUrl("http://127.0.0.1:8000")
    """vLLM's base URL, probed directly once it is back"""
    expect: float | None = Field(default=None, gt=0)
    """seconds the window is expected to last, announced by the drain (unset: the load time
    the gateway last measured, else none announced)"""
    drain_timeout: float = Field(default=120.0, gt=0)
    """seconds to wait for the running requests to finish before giving up (and resuming)"""
    ready_timeout: float = Field(default=600.0, gt=0)
    """seconds to wait after the command for the upstream to be ready and answer"""
    admin_token: SecretStr | None = None
    """the gateway's admin token (HERDLESS_GATEWAY_ADMIN_TOKEN of herdless serve)"""
    upstream_api_key: SecretStr | None = None
    """API key for the probe sent to vLLM (vLLM's --api-key); unset: none"""


@dataclass(frozen=True, slots=True, kw_only=True)
class MaintenanceReport:
    """What one window did.

    Attributes:
        changed: whether the change went in (the command ran and the upstream is back).
        outcome: ``done``, ``resumed_old`` (the command failed, the old upstream serves),
            ``drained`` (the gateway stays drained), ``busy`` (requests still ran at the
            drain timeout: resumed, the command not run) or ``refused`` (no drain).
        window: seconds from the drain to the resume (or to the end, when drained).
        load_time: seconds from the command's start to the upstream ready (``None``: not).
        held: requests held in the gateway's queue through the window (waiting at the
            resume, ``herdless_gateway_drain_held_total``).
        spilled: requests answered by the hosted fallback during the window.
        refused: requests refused (429 or 503) during the window.
        message: one line saying what happened.
    """

    changed: bool
    outcome: str
    window: float
    load_time: float | None
    held: int
    spilled: int
    refused: int
    message: str

    def lines(self) -> list[str]:
        """The report as printed at the end."""
        load = "" if self.load_time is None else f", upstream loaded in {self.load_time:.1f}s"
        return [
            self.message,
            f"maintenance window: {self.window:.1f}s{load}; during it: held {self.held}, "
            f"spilled {self.spilled}, refused {self.refused}",
        ]

    def as_dict(self) -> dict[str, object]:
        """The report's fields."""
        return asdict(self)


def counters(metrics: str) -> dict[str, int]:
    """``held``, ``spilled`` and ``refused`` so far, from the gateway's /metrics text."""
    names = {
        "herdless_gateway_drain_held_total": "held",
        "herdless_gateway_spills_total": "spilled",
        "herdless_gateway_rejections_total": "refused",
    }
    found = dict.fromkeys(names.values(), 0)
    for line in metrics.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            found[names[name]] += int(float(line.rsplit(" ", 1)[1]))
    return found


def _client(
    url: AnyHttpUrl, secret: SecretStr | None, timeout: float, transport: httpx.BaseTransport | None
) -> httpx.Client:
    """An HTTP client for ``url``, with ``secret`` as its bearer token when given."""
    auth = {} if secret is None else {"authorization": f"Bearer {secret.get_secret_value()}"}
    return httpx.Client(
        base_url=str(url).rstrip("/"), headers=auth, timeout=timeout, transport=transport
    )


class _Window:
    """One window's steps over two HTTP clients (the gateway's admin, the upstream)."""

    def __init__(
        self,
        settings: MaintainSettings,
        *,
        say: Callable[[str], None],
        clock: Callable[[], float],
        transport: httpx.BaseTransport | None,
    ) -> None:
        self.s = settings
        self.say = say
        self.clock = clock
        self.gw = _client(settings.gateway, settings.admin_token, 10, transport)
        self.up = _client(settings.upstream, settings.upstream_api_key, 30, transport)

    def close(self) -> None:
        self.gw.close()
        self.up.close()

    def status(self) -> dict[str, object]:
        answer: dict[str, object] = self.gw.get("/readyz").json()
        return answer

    def counters(self) -> dict[str, int]:
        return counters(self.gw.get("/metrics").text)

    def admin(self, action: str, **params: float) -> httpx.Response:
        return self.gw.post(f"/admin/{action}", params=params)

    def _until(
        self, pending: Callable[[], str | None], *, since: float, timeout: float, every: float
    ) -> bool:
        """Poll until ``pending()`` names nothing left (True), or until ``timeout`` seconds
        after ``since`` (False); says what is still pending every ``every`` seconds."""
        last = self.clock()
        while (waiting := pending()) is not None:
            now = self.clock()
            if now - since > timeout:
                return False
            if now - last >= every:
                self.say(f"waiting for {waiting} ({now - since:.0f}s)")
                last = now
            time.sleep(_POLL)
        return True

    def wait_idle(self) -> bool:
        """Until nothing runs upstream (True), or ``drain_timeout`` passed (False)."""

        def running() -> str | None:
            count = int(str(self.status().get("inflight", 0)))
            return f"{count} running requests to finish" if count > 0 else None

        return self._until(running, since=self.clock(), timeout=self.s.drain_timeout, every=1.0)

    def answers(self) -> bool:
        """Whether the upstream is ready and answers one probe request directly."""
        try:
            if self.up.get("/health", timeout=5).status_code != 200:
                return False
            models = self.up.get("/v1/models", timeout=10)
            if models.status_code != 200:
                return False
            model = models.json()["data"][0]["id"]
            probe = {"model": model, "messages": [{"role": "user", "content": _PROBE}]}
            answer = self.up.post("/v1/chat/completions", json={**probe, "max_tokens": 1})
        except (httpx.HTTPError, ValueError, KeyError, IndexError):
            return False
        return answer.status_code == 200

    def wait_ready(self, since: float) -> bool:
        """Until the upstream answers (True) or ``ready_timeout`` after ``since`` (False)."""

        def loading() -> str | None:
            return None if self.answers() else "the upstream to load"

        if not self._until(loading, since=since, timeout=self.s.ready_timeout, every=5.0):
            return False
        # The gateway admits again only once its own health poll saw it back.
        deadline = self.clock() + 5.0
        while not self.status().get("upstream_ready") and self.clock() < deadline:
            time.sleep(_POLL / 5)
        return True


def maintain(
    settings: MaintainSettings,
    command: Sequence[str],
    *,
    say: Callable[[str], None] = print,
    run: Callable[[Sequence[str]], int] | None = None,
    clock: Callable[[], float] = time.monotonic,
    transport: httpx.BaseTransport | None = None,
) -> MaintenanceReport:
    """Run one maintenance window (see the module's text) and return its report.

    Args:
        settings: the gateway, the upstream, the expected length, the bounds.
        command: what to run while drained (argv; ``run`` runs it).
        say: where the progress lines go.
        run: runs the command and returns its exit status (default: a subprocess).
        clock: monotonic seconds (tests).
        transport: httpx transport for both clients (tests).

    Raises:
        httpx.HTTPError: the gateway could not be reached.
    """
    run = run or (lambda argv: subprocess.run(list(argv), check=False).returncode)
    w = _Window(settings, say=say, clock=clock, transport=transport)
    try:
        return _window(w, command, run)
    finally:
        w.close()


def _window(
    w: _Window, command: Sequence[str], run: Callable[[Sequence[str]], int]
) -> MaintenanceReport:
    before = w.counters()
    known = w.status().get("load_time")
    expect = w.s.expect or (float(str(known)) if known else None)
    start = w.clock()

    def report(changed: bool, outcome: str, message: str, load: float | None) -> MaintenanceReport:
        after = w.counters()
        delta = {name: after[name] - before[name] for name in before}
        return MaintenanceReport(
            changed=changed,
            outcome=outcome,
            window=w.clock() - start,
            load_time=load,
            message=message,
            **delta,
        )

    drained = w.admin("drain", **({} if expect is None else {"expect": round(expect, 3)}))
    if drained.status_code != 200:
        reason = drained.text[:200]
        return report(False, "refused", f"the gateway refused the drain: {reason}", None)
    w.say(f"drained{'' if expect is None else f', announced {expect:.0f}s'}")
    if not w.wait_idle():
        w.admin("resume")
        message = f"requests still ran after {w.s.drain_timeout:g}s: resumed, command not run"
        return report(False, "busy", message, None)
    w.say(f"nothing runs: running {' '.join(command)}")
    began = w.clock()
    status = run(command)
    if status != 0:
        if w.answers():
            w.admin("resume")
            message = f"the command failed (status {status}); resumed on the old upstream"
            return report(False, "resumed_old", message, None)
        message = (
            f"the command failed (status {status}) and the upstream does not answer: the "
            "gateway stays drained; fix the upstream, then POST /admin/resume"
        )
        return report(False, "drained", message, None)
    if not w.wait_ready(began):
        message = (
            f"the upstream did not answer within {w.s.ready_timeout:g}s: the gateway stays "
            "drained; when it is back, POST /admin/resume"
        )
        return report(False, "drained", message, None)
    load = w.clock() - began
    resumed = w.admin("resume", load_time=round(max(load, 0.001), 3))
    if resumed.status_code != 200:
        message = f"the upstream is back but the gateway refused the resume: {resumed.text[:200]}"
        return report(False, "drained", message, load)
    return report(True, "done", "the change went in: resumed", load)


def _command() -> SettingsCommand[MaintainSettings]:
    command = SettingsCommand(
        MaintainSettings,
        prog="herdless maintain",
        description="One command for a maintenance window: drain the gateway, wait until "
        "nothing runs,\nrun COMMAND (restart vLLM), wait until the upstream answers, resume; "
        "then report the\nwindow. Exit status 0: the change went in; 1: it did not.",
        usage="[options] -- COMMAND...",
    )
    command.parser.add_argument(
        "command", nargs=argparse.REMAINDER, metavar="COMMAND", help="what to run while drained"
    )
    return command


def help_text() -> str:
    """The ``herdless maintain --help`` text (also the docs' CLI reference)."""
    return _command().format_help()


def main(argv: Sequence[str], *, out: TextIO | None = None) -> int:
    """Run ``herdless maintain``; returns the exit status (2 for bad arguments)."""
    try:
        settings, args = _command().parse(argv)
    except SystemExit as exc:
        return exit_status(exc)
    command = list(getattr(args, "command", None) or [])
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        return fail("herdless maintain", "a COMMAND to run is required (after --)")
    stream = out or sys.stdout

    def say(line: str) -> None:
        print(f"herdless maintain: {line}", file=stream, flush=True)

    try:
        report = maintain(settings, command, say=say)
    except httpx.HTTPError as exc:
        return fail("herdless maintain", f"cannot reach the gateway: {exc}", status=1)
    for line in report.lines():
        say(line)
    return 0 if report.changed else 1
