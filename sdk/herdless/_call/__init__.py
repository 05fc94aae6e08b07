"""One call's decisions, in one place, read from the bottom up.

- ``decisions``: the values the rules return (``Wait``, ``Queue``, ``Move``, ``Fail``,
  ``Requeued``, ``Budgeted``);
- ``errors``: the errors a call raises, built with its context;
- ``record``: ``Call``, the record of one call (its deadline, attempts, events);
- ``visit``: ``Visit``, one call's visit to one backend, the only writer of its fields;
- ``checks``: the checks before an attempt, and the pure ``decide`` after it;
- ``race``: a late attempt raced against a hedge at the next backend;
- ``flow``: ``CallFlow``, the route walk and the loop at each backend, top to bottom.

The package imports nothing of its own here: each module is imported by its full name.
"""
