"""Settings read from the environment: one place for the engine, the API, the workers and k8s.

Each field is read from the environment variable of the same name in upper case
(``ner_api_keys`` from ``NER_API_KEYS``...).
"""

from __future__ import annotations

from functools import lru_cache

from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every setting the service reads."""

    model_config = SettingsConfigDict(env_file=None, extra="ignore")

    # engine
    ner_model: str = "en-conll03"
    ner_models: str = ""  # comma-separated models requests may name besides NER_MODEL (empty: the current shipped ones, CURRENT_MODELS)
    ner_model_memory_mb: int = 2560  # weights kept loaded, the least recently used model unloaded beyond (the default and the largest other fit; k8s: 4 Gi)
    ner_device: str = "cpu"
    ner_dtype: str = "auto"  # auto: bfloat16 on a CPU with bfloat16 instructions (AVX512_BF16, AMX), else float32 (engine/cpu.py)
    ner_threads: int = 0  # torch threads of a process (0: its CPUs by affinity and cgroup quota; 1 per Celery worker process)
    # REST API
    ner_api_keys: str = ""  # comma-separated; empty = development mode without authentication (logged)
    ner_rate_limit_per_minute: int = 600
    ner_max_text_chars: int = 20_000  # a batch job's document
    ner_max_entities_text_chars: int = 5_000  # a text of POST /v1/entities: one the default deployment answers within the timeout
    ner_max_texts: int = 64
    ner_request_timeout_s: float = 60.0
    ner_header_timeout_s: float = 30.0  # a request's headers must arrive within this, from its first byte (else 408, closed)
    ner_body_timeout_s: float = 60.0  # ... and its body within this after them (a body short of its Content-Length: closed)
    ner_microbatch: bool = True
    ner_batch_wait_ms: float = 20.0  # long enough for the clients of the batch just answered to send their next request
    ner_batch_wait_fraction: float = 0.05  # ... or this fraction of the previous engine call, when longer (a loaded machine)
    ner_batch_wait_max_ms: float = 250.0  # ... but never longer than this
    ner_batch_max_texts: int = 16
    ner_queue_max: int = 256  # texts admitted and not answered yet
    ner_max_request_tokens: int = 24_576  # estimated tokens of work one request may hold, its texts and its labels' queries (413 above; white space is nearly free)
    ner_admission_fraction: float = 0.8  # admit while the work ahead fits this fraction of NER_REQUEST_TIMEOUT_S (else 429)
    ner_prior_ms_per_token: float = 50.0  # the engine's rate assumed until a call is measured: pessimistic (shed, not time out)
    ner_fixed_ms_per_token: float = 0.0  # > 0: admission assumes this rate and never measures it (0: the measured rate)
    ner_long_text_tokens: int = 160  # a text of more estimated tokens is cut into pieces that interleave with other requests
    ner_piece_tokens: int = 64  # ... of at most this many
    ner_batch_split_tokens: int = 64  # the pieces of long texts one batch may hold
    ner_auth_failures_per_minute: int = 10  # wrong or missing keys from one address before 429
    ner_trusted_proxies: str = ""  # comma-separated IPs/CIDRs of reverse proxies whose X-Forwarded-For is believed (empty: none)
    # pipeline
    database_url: str = "sqlite:///./padellm_ner.db"
    redis_url: str = "redis://127.0.0.1:6379/0"
    pipeline_chunk_size: int = 16
    nightly_cron: str = "0 2 * * *"
    reprocess_on_model_change: bool = False
    pipeline_migrate_on_start: bool = True  # the API upgrades the schema when it starts (k8s: a migrate Job does, so false)
    pipeline_visibility_timeout_s: int = 3600  # unacknowledged chunks are redelivered (and stalled jobs requeued) after this
    pipeline_enqueue_retry_s: int = 30  # beat enqueues a stored job that was never handed to Redis after this (and checks this often)
    redis_timeout_s: float = 5.0  # a Redis connect, command or publish slower than this fails (broker, results, /readyz)
    database_connect_timeout_s: float = 10.0  # connecting to PostgreSQL
    database_statement_timeout_s: float = 60.0  # PostgreSQL statement_timeout; SQLite's wait for a lock
    # logging
    log_level: str = "INFO"

    def served_models(self) -> list[str] | None:
        """``NER_MODELS`` as a list (None: the current shipped models)."""
        names = [name.strip() for name in self.ner_models.split(",") if name.strip()]
        return names or None


@lru_cache
def get_settings() -> Settings:
    """The process-wide settings (cached; tests call ``get_settings.cache_clear()`` after changing the env)."""
    return Settings()
