"""What a browser sends when a page of another origin calls ``/v1/chat/completions``.

Chromium asks first (the preflight, ``PREFLIGHT``), naming the method and the headers the
page will send that are not safe-listed: openai-node's ``x-stainless-*`` among them.
The call itself then carries the page's ``Origin`` (``PAGE``).
"""

from __future__ import annotations

PAGE = {"origin": "https://chat.example"}
ASKED = "authorization,content-type,x-stainless-lang,x-stainless-retry-count,x-stainless-timeout"
PREFLIGHT = {
    **PAGE,
    "access-control-request-method": "POST",
    "access-control-request-headers": ASKED,
}
