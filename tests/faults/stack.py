"""The fault matrix's stack: an emulated vLLM behind the gateway, and an emulated hosted model.

Each part is a real ``python -m herdless ...`` process on 127.0.0.1 (``ServerProcess``);
the ports stay fixed for the whole module so that a crashed or restarted process
comes back where the gateway and the SDK expect it. ``heal()`` puts everything back
to healthy between scenarios; every process is stopped at the end, also on failure.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx

from herdless.launch.servers import ServerProcess

ADMIN_TOKEN = "fault-admin-token"
API_KEY = "fault-client-key"
SPEED = 20  # the emulated GPU runs 20x faster: a burst takes a second, not a minute
_EMULATOR = ["--speed", str(SPEED), "--max-num-seqs", "32", "--answer-max-tokens", "24"]
_GATEWAY_FLAGS = {
    "--max-concurrency": "8",
    "--max-queue": "16",
    "--queue-timeout": "2",
    "--health-interval": "0.2",
    "--connect-timeout": "0.5",
    "--read-timeout": "3",
    "--shutdown-grace": "1",
    "--drain-retry-after": "2",
    "--upstream-retry-after": "1",
}


def wait_for(condition: object, timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition()`` until true; bounded: raises instead of hanging."""
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached in {timeout} s")
        time.sleep(0.05)


class Stack:
    """Primary emulator + gateway + hosted emulator, with fault switches."""

    def __init__(self, log_dir: Path) -> None:
        self.vllm = ServerProcess(
            ["emulate", "--model", "local-llm", *_EMULATOR], log_path=log_dir / "vllm.log"
        )
        self.hosted = ServerProcess(
            ["emulate", "--model", "hosted-mini", *_EMULATOR], log_path=log_dir / "hosted.log"
        )
        flags = [item for pair in _GATEWAY_FLAGS.items() for item in pair]
        self.gateway = ServerProcess(
            ["serve", "--upstream", self.vllm.url, *flags],
            ready_path="/readyz",
            log_path=log_dir / "gateway.log",
            env={
                "HERDLESS_GATEWAY_API_KEYS": API_KEY,
                "HERDLESS_GATEWAY_ADMIN_TOKEN": ADMIN_TOKEN,
            },
        )
        self.http = httpx.Client(timeout=5.0)

    def start(self) -> Stack:
        self.vllm.start()
        self.hosted.start()
        self.gateway.start()
        return self

    def stop(self) -> None:
        self.http.close()
        for server in (self.gateway, self.vllm, self.hosted):
            server.stop(grace=2.0)

    # -- faults ---------------------------------------------------------------------------

    def faults(self, server: ServerProcess, **faults: object) -> None:
        """POST the emulator's faults (steady ones replace the previous; actions run once)."""
        self.http.post(server.url + "/_emulator/faults", json=faults).raise_for_status()

    def admin(self, action: str) -> None:
        headers = {"authorization": f"Bearer {ADMIN_TOKEN}"}
        self.http.post(f"{self.gateway.url}/admin/{action}", headers=headers).raise_for_status()

    def restart(self, server: ServerProcess, *, after: float = 0.0) -> None:
        """Stop (SIGTERM, or already dead) and start again on the same port."""
        server.stop(grace=2.0)
        time.sleep(after)
        server.process = None
        server.start()

    # -- health -----------------------------------------------------------------------------

    def heal(self) -> None:
        """Back to healthy: processes up, faults cleared, gateway admitting, no slot held."""
        for server in (self.vllm, self.hosted):
            if server.returncode() is not None:
                self.restart(server)
            # Faults first: a hung emulator does not answer /health either.
            wait_for(lambda s=server: self._cleared(s.url), what="emulator faults cleared")
            wait_for(lambda s=server: self._answers(s.url + "/health"), what="emulator /health")
        if self.gateway.returncode() is not None:
            self.restart(self.gateway)
        self.admin("resume")
        wait_for(lambda: self._answers(self.gateway.url + "/readyz"), what="gateway ready")
        wait_for(lambda: self.gateway_status()["inflight"] == 0, what="gateway slots freed")

    def _cleared(self, url: str) -> bool:
        try:  # refused while a refuse_for / maintenance window lasts: try again
            return self.http.delete(url + "/_emulator/faults", timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    def _answers(self, url: str) -> bool:
        try:
            return self.http.get(url, timeout=1.0).status_code == 200
        except httpx.TransportError:
            return False

    def gateway_status(self) -> dict[str, object]:
        try:
            response = self.http.get(self.gateway.url + "/readyz", timeout=1.0)
        except httpx.TransportError:
            return {"inflight": -1, "queue_depth": -1}
        status: dict[str, object] = response.json()
        return status

    def gateway_500s(self) -> int:
        """``requests_total{code="500"}`` of the running gateway process (0 if none)."""
        try:
            text = self.http.get(self.gateway.url + "/metrics", timeout=1.0).text
        except httpx.TransportError:
            return 0
        found = re.search(r'herdless_gateway_requests_total\{code="500"\} (\d+)', text)
        return int(found.group(1)) if found else 0

    def gateway_rss_mb(self) -> float:
        """Resident memory of the gateway process, MiB (Linux ``/proc``)."""
        status = Path(f"/proc/{self.gateway.pid}/status").read_text()
        found = re.search(r"VmRSS:\s+(\d+) kB", status)
        return int(found.group(1)) / 1024 if found else 0.0

    def tracebacks(self) -> int:
        """Tracebacks written by the gateway so far (its log spans its restarts)."""
        return self.gateway.logs(tail=10_000_000).count("Traceback")
