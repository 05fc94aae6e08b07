"""``herdless demo``: a day at the office, played in about a minute on an embedded default.

An emulated vLLM (the company's GPU), the gateway in front of it and a second
emulator playing the hosted model run on free loopback ports; a crowd of
employees chats through herdless clients; the GPU saturates, the gateway
refuses with 429s, the model is swapped for maintenance and traffic moves to
the hosted model and back. The live view and the final summary are computed
from the clients' own events (:class:`~herdless.demo.tally.Tally`).
"""
