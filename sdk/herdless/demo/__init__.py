"""herdless.demo."""
