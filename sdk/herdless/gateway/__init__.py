"""The gateway (``herdless serve``): admission in front of vLLM, refusals with Retry-After."""
