"""Batch NER jobs: documents and entities in SQLite or PostgreSQL, processed by Celery workers
(or in-process by ``padellm-ner jobs run``) with exactly-once results."""
