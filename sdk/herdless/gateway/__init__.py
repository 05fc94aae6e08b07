"""herdless.gateway."""
