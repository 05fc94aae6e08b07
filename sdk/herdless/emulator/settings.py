"""The emulator's settings: flags of ``herdless emulate``, each also ``HERDLESS_EMULATOR_<NAME>``.

Precedence: command-line flag, then environment variable, then the default.
"""

from __future__ import annotations

import json
from typing import Literal, Self

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from herdless._cli_settings import config_by_name
from herdless.emulator.engine import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_MAX_NUM_BATCHED_TOKENS,
    EngineConfig,
)
from herdless.emulator.faults import FaultActions, Faults, MetricsOutage

__all__ = ["EmulatorSettings"]


class EmulatorSettings(BaseSettings):
    """Every knob of the emulated vLLM server (times in seconds)."""

    model_config = SettingsConfigDict(env_prefix="HERDLESS_EMULATOR_", frozen=True, extra="forbid")

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(
        default=8000, ge=0, le=65535, description="port to listen on (0: any free port)"
    )
    control_port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="also serve /_emulator/faults (only) on this port, which no fault "
        "closes: the way to end refuse_for or maintenance_for early (0: any free port)",
    )
    model: str = Field(default="emulated-llama-3-8b", min_length=1, description="served model name")
    allowed_origins: str = Field(
        default="[]",
        description="origins of the web pages that may call it (CORS), a JSON list as vLLM's "
        'flag (["*"]: any); as vLLM, none by default',
    )
    max_model_len: int = Field(
        default=8192, ge=2, description="context length: prompt plus max_tokens"
    )
    max_num_seqs: int = Field(default=256, ge=1, description="most sequences in one batch")
    max_num_batched_tokens: int = Field(
        default=DEFAULT_MAX_NUM_BATCHED_TOKENS,
        ge=1,
        description="token budget of one engine step, shared by decodes (1 each) and "
        "prefill chunks: longer prompts are prefilled over several steps (vLLM's flag; "
        "its default on an H100/H200-class GPU)",
    )
    kv_cache_tokens: int = Field(
        default=400_000,
        ge=2,
        description="KV-cache size in tokens: kv_cache_tokens // block_size blocks "
        "(num_gpu_blocks in vllm:cache_config_info)",
    )
    block_size: int = Field(
        default=DEFAULT_BLOCK_SIZE, ge=1, description="tokens per KV block (vLLM's flag)"
    )
    max_num_queued_reqs: int | None = Field(
        default=None,
        ge=0,
        description="answer 503 when this many requests already wait (unset: no cap)",
    )
    startup_delay: float = Field(
        default=0.0, ge=0, description="seconds of model loading before the port is bound"
    )
    wake_time: float = Field(
        default=0.5,
        ge=0,
        description="seconds POST /wake_up takes after POST /sleep (vLLM's sleep mode)",
    )
    speed: float = Field(
        default=1.0, gt=0, description="time scale: 10 runs the GPU ten times faster"
    )
    decode_base: float = Field(
        default=0.012, ge=0, description="seconds of a decode step, any batch"
    )
    decode_per_seq: float = Field(
        default=0.000_12, ge=0, description="seconds added per batched sequence"
    )
    prefill_tokens_per_s: float = Field(
        default=16_000.0, gt=0, description="prefill speed, tokens/s"
    )
    on_kv_exhausted: Literal["preempt", "crash"] = Field(
        default="preempt",
        description="what a full KV cache does: preempt (vLLM) or crash the process",
    )
    enable_prefix_caching: bool = Field(
        default=False,
        description="share the KV blocks of prompts that begin alike, as vLLM's prefix cache "
        "(vLLM's flag; on by default in vLLM, off here so that a bench's prompts that begin "
        "alike are not shared unless it asks)",
    )
    stream_interval: int = Field(
        default=1, ge=1, description="stream tokens in groups of N after the first (vLLM's flag)"
    )
    answer_min_tokens: int = Field(
        default=16, ge=0, description="shortest natural answer (before EOS)"
    )
    answer_max_tokens: int = Field(
        default=256, ge=0, description="longest natural answer (before EOS)"
    )
    seed: int = Field(default=0, description="seed of the fault injector's random draws")
    hang: bool = Field(default=False, description="fault: accept requests, never answer")
    error_rate: float = Field(
        default=0.0, ge=0, le=1, description="fault: fraction answered with an error"
    )
    error_status: int = Field(
        default=500, ge=400, le=599, description="fault: status of injected errors"
    )
    extra_latency: float = Field(
        default=0.0, ge=0, description="fault: seconds added to each completion"
    )
    cut_after: int | None = Field(
        default=None, ge=0, description="fault: cut streams after N events"
    )
    slow_rate: float = Field(
        default=0.0,
        ge=0,
        le=1,
        description="fault: fraction of completions held --slow-latency s before their first byte",
    )
    slow_latency: float = Field(
        default=0.0, ge=0, description="fault: seconds a --slow-rate completion is held"
    )
    metrics_error_for: float | None = Field(
        default=None,
        ge=0,
        description="fault: GET /metrics answers 500 for this many seconds after serving starts",
    )
    metrics_stall_for: float | None = Field(
        default=None,
        ge=0,
        description="fault: GET /metrics gets no answer for this many seconds after serving "
        "starts (held requests are answered when it ends)",
    )
    crash_after: float | None = Field(
        default=None,
        ge=0,
        description="fault: exit abruptly this many seconds after serving starts",
    )
    access_log: bool = Field(default=False, description="log every request (costly under load)")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="log level"
    )

    @field_validator("allowed_origins")
    @classmethod
    def _json_list(cls, value: str) -> str:
        try:
            origins = json.loads(value)
        except ValueError:
            origins = None
        if not isinstance(origins, list) or not all(isinstance(o, str) for o in origins):
            raise ValueError("must be a JSON list of origins, as vLLM's: '[\"*\"]'")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.kv_cache_tokens < self.max_model_len:
            # vLLM refuses to start when one full-length sequence does not fit either.
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) must be >= "
                f"max_model_len ({self.max_model_len})"
            )
        capacity = self.kv_cache_tokens // self.block_size * self.block_size
        if capacity < self.max_model_len:
            raise ValueError(
                f"kv_cache_tokens ({self.kv_cache_tokens}) holds "
                f"{self.kv_cache_tokens // self.block_size} blocks of block_size "
                f"({self.block_size}): {capacity} tokens, fewer than max_model_len "
                f"({self.max_model_len})"
            )
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM's SchedulerConfig refuses it too.
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= "
                f"max_num_seqs ({self.max_num_seqs})"
            )
        if self.metrics_error_for is not None and self.metrics_stall_for is not None:
            raise ValueError("give metrics_error_for or metrics_stall_for, not both")
        if self.answer_min_tokens > self.answer_max_tokens:
            raise ValueError("answer_min_tokens must be <= answer_max_tokens")
        return self

    def origins(self) -> list[str]:
        """``allowed_origins``, read as vLLM reads its flag (``json.loads``)."""
        origins: list[str] = json.loads(self.allowed_origins)
        return origins

    def engine_config(self) -> EngineConfig:
        """The engine's part of these settings (each of its fields by name, see
        ``config_by_name``)."""
        return config_by_name(EngineConfig, self)

    def faults(self) -> Faults:
        """The steady faults switched on at start (each by name, see ``config_by_name``)."""
        return config_by_name(Faults, self)

    def metrics_outage(self) -> MetricsOutage | None:
        """The ``/metrics`` fault to begin when serving starts, if one is set."""
        actions = FaultActions(
            metrics_error_for=self.metrics_error_for, metrics_stall_for=self.metrics_stall_for
        )
        return actions.metrics_outage()
