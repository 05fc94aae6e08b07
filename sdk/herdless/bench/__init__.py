"""``herdless bench``: load scenarios that compare arms in one run and write results.

Every scenario runs its arms interleaved and repeated, reports medians and
ratios against a baseline measured in the same run (never a lone absolute
time), and writes a Markdown table, a JSON file and PNG plots to an output
folder. Scenarios (``herdless.bench.cli.SCENARIOS``): ``herd``, ``shared``, ``spill``,
``overload``, ``outage``, ``hedge``, ``overhead``. They need the ``bench`` extra: the
``demo`` one, openai and tenacity for the arms they compare, aiolimiter to pace the
overhead benchmark's connections.
"""
