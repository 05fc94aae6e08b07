"""``herdless bench``: load scenarios that compare arms in one run and write results.

Every scenario runs its arms interleaved and repeated, reports medians and
ratios against a baseline measured in the same run (never a lone absolute
time), and writes a Markdown table, a JSON file and PNG plots to an output
folder. Scenarios: ``herd``, ``overload``, ``outage``, ``overhead``.
"""
