"""The gateway's admission core: pure, clock-injected, no I/O.

Who runs now, who waits and in which order, who is refused and when to come back,
and how much the engine behind the gateway can hold. The HTTP edge reaches it only
through :class:`herdless.gateway.gate.Gate`.
"""
