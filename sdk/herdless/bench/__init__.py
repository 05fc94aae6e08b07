"""herdless.bench."""
