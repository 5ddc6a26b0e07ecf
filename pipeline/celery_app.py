"""The Celery application (``celery -A pipeline.celery_app worker`` / ``beat``): Redis broker and
result backend from ``REDIS_URL`` with every call bounded by ``REDIS_TIMEOUT_S`` (a worker's
reads excepted), late acknowledgement, and the beat schedule (the nightly run from ``NIGHTLY_CRON``, a sweep that
enqueues jobs stored but never handed to Redis, and one that requeues stalled jobs)."""

from __future__ import annotations

from celery import Celery
from celery.schedules import crontab
from celery.signals import celeryd_init

from ner_service.settings import get_settings

#: Seconds a new pool process may take to load the NER model before Celery gives up on it.
WORKER_PROC_ALIVE_TIMEOUT_S = 600.0
#: A publish is tried at most this many more times (0.5 s apart) before the send fails.
PUBLISH_RETRIES = 2


def parse_cron(expression: str) -> crontab:
    """A Celery crontab from a 5-field cron string (minute hour day-of-month month day-of-week)."""
    fields = expression.split()
    if len(fields) != 5:
        raise ValueError(f"NIGHTLY_CRON must have 5 fields (minute hour day-of-month month day-of-week), got {expression!r}")
    minute, hour, day_of_month, month_of_year, day_of_week = fields
    return crontab(minute=minute, hour=hour, day_of_month=day_of_month, month_of_year=month_of_year, day_of_week=day_of_week)


def create_app() -> Celery:
    """The Celery app configured from the settings."""
    settings = get_settings()
    visibility = settings.pipeline_visibility_timeout_s
    timeout = settings.redis_timeout_s  # a hung Redis (stopped, not dead) fails calls instead of holding them
    celery = Celery("padellm_ner", broker=settings.redis_url, backend=settings.redis_url, include=["pipeline.tasks"])
    celery.conf.update(
        task_serializer="json",
        accept_content=["json"],
        result_serializer="json",
        timezone="UTC",
        enable_utc=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,  # job state lives in the database
        worker_prefetch_multiplier=1,
        # pool processes load the engine in worker_process_init before reporting up (Celery's default wait is 4 s)
        worker_proc_alive_timeout=WORKER_PROC_ALIVE_TIMEOUT_S,
        broker_connection_retry_on_startup=True,
        broker_connection_timeout=timeout,
        task_publish_retry_policy={"max_retries": PUBLISH_RETRIES, "interval_start": 0, "interval_step": 0.5, "interval_max": 0.5},
        redis_socket_timeout=timeout,
        redis_socket_connect_timeout=timeout,
        # a chunk left unacknowledged by a dead worker is delivered again after `visibility` seconds
        broker_transport_options={
            "visibility_timeout": visibility,
            "unacked_restore_interval": max(1, min(60, visibility // 4)),
            "unacked_restore_throttle": 1,
            "socket_timeout": timeout,
            "socket_connect_timeout": timeout,
        },
        beat_schedule={
            "nightly-pending-documents": {"task": "pipeline.nightly", "schedule": parse_cron(settings.nightly_cron)},
            "enqueue-undispatched-jobs": {"task": "pipeline.dispatch_undispatched", "schedule": float(settings.pipeline_enqueue_retry_s),
                                          "options": {"expires": float(settings.pipeline_enqueue_retry_s)}},
            "requeue-stalled-jobs": {"task": "pipeline.requeue_stalled", "schedule": max(1.0, visibility / 2)},
        },
    )
    return celery


@celeryd_init.connect
def _workers_wait_for_redis(conf, **_: object) -> None:
    """A worker reads the broker without ``socket_timeout`` (it keeps the connect timeout): kombu
    gives up on an acknowledgement that times out yet keeps the message counted as unacknowledged,
    and with the prefetch window full the worker never fetches again. So a worker waits for a
    frozen Redis; kombu's health check replaces a BRPOP connection that stays silent."""
    conf.broker_transport_options = {name: value for name, value in conf.broker_transport_options.items() if name != "socket_timeout"}


app = create_app()
