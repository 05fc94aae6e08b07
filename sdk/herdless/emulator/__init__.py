"""herdless.emulator."""
