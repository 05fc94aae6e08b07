"""A real browser (headless Chromium) running openai-node in a page of another origin.

``browser_page.html`` is served from its own origin on 127.0.0.1, beside the pinned
openai-node's ES modules; Chromium opens it, the page calls the server named in its query
as a web app does, and POSTs what happened back to its own origin. Chromium enforces
CORS as it does for every web app: what the page reads is what the server allowed.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PAGE = Path(__file__).with_name("browser_page.html")
_NAMES = ("chromium", "chromium-browser", "google-chrome")


def chromium() -> str | None:
    """The browser to run: ``HERDLESS_TEST_CHROMIUM``, else the first on PATH."""
    return os.environ.get("HERDLESS_TEST_CHROMIUM") or next(
        (found for name in _NAMES if (found := shutil.which(name))), None
    )


class _Page(http.server.BaseHTTPRequestHandler):
    """GET: the page and openai-node's files; POST /result: what the page saw."""

    openai: Path
    results: list[dict[str, Any]]
    arrived: threading.Event

    def do_GET(self) -> None:
        path = urllib.parse.urlsplit(self.path).path
        file = PAGE if path == "/page.html" else None
        if path.startswith("/openai/") and ".." not in path:
            file = self.openai / path.removeprefix("/openai/")
        if file is None or not file.is_file():
            self.send_error(404)
            return
        body = file.read_bytes()
        kind = "text/html" if file.suffix == ".html" else "text/javascript"
        self.send_response(200)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["content-length"]))
        self.results.append(json.loads(body))
        self.send_response(204)
        self.end_headers()
        self.arrived.set()

    def log_message(self, format: str, *args: Any) -> None:
        pass


class PageServer:
    """The page and openai-node's files, served on a free port of 127.0.0.1 (its origin).
    One page runs at a time: what it POSTs is read by the :meth:`run` that opened it."""

    def __init__(self, js_clients: Path) -> None:
        attributes = {"openai": js_clients / "node_modules" / "openai", "results": []}
        self._handler = type("Page", (_Page,), attributes)
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler)
        self.origin = f"http://127.0.0.1:{self._server.server_port}"
        self._one_at_a_time = threading.Lock()

    @contextmanager
    def serving(self) -> Iterator[PageServer]:
        thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self._server.shutdown()
            self._server.server_close()

    def run(self, browser: str, timeout: float = 60.0, **query: str) -> dict[str, Any]:
        """Open the page with ``query`` in a fresh headless Chromium; return what it POSTed.
        Chromium is stopped, whatever happens.

        Raises:
            TimeoutError: the page reported nothing within ``timeout`` seconds.
        """
        with self._one_at_a_time:
            return self._run(browser, timeout, query)

    def _run(self, browser: str, timeout: float, query: dict[str, str]) -> dict[str, Any]:
        handler = self._handler
        handler.arrived = threading.Event()
        handler.results.clear()
        url = f"{self.origin}/page.html?{urllib.parse.urlencode(query)}"
        with tempfile.TemporaryDirectory(prefix="herdless-chromium-") as profile:
            command = [
                browser,
                "--headless=new",
                "--no-sandbox",  # root in CI containers
                "--disable-dev-shm-usage",  # a container's /dev/shm is small
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                f"--user-data-dir={profile}",
                url,
            ]
            log = Path(profile) / "chromium.log"
            with log.open("wb") as stderr:
                process = subprocess.Popen(
                    command, stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True
                )
                try:
                    if not handler.arrived.wait(timeout):
                        said = log.read_text(errors="replace")[-2000:]
                        raise TimeoutError(
                            f"the page reported nothing in {timeout} s: {url}\n{said}"
                        )
                finally:
                    os.killpg(process.pid, signal.SIGKILL)
                    process.wait()
        return handler.results[0]
