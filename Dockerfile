# syntax=docker/dockerfile:1
# The specdec-operator image: build the wheel (and wheels of every dependency) in one stage, install them
# into a clean slim base in the next, so compilers and build caches never reach the runtime image.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
# Dependencies first, each at the version the tests ran on and checked against the lock's hashes
# (requirements/operator.lock, written by hack/lock); then the project alone.
COPY requirements/operator.lock ./requirements/
RUN pip wheel --wheel-dir /wheels --require-hashes -r requirements/operator.lock
COPY pyproject.toml README.md ./
COPY operator ./operator
COPY runtime ./runtime
RUN pip wheel --wheel-dir /wheels --no-deps .

FROM ${PYTHON_IMAGE} AS operator
LABEL org.opencontainers.image.title="specdec-operator" \
      org.opencontainers.image.description="Kubernetes operator for speculative-decoding vLLM on AMD ROCm fleets" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Memory goes back to the node when a fleet shrinks: CPython's own allocator frees a 1 MiB arena only when
# every object in it is gone, so a few survivors pin most of what 500 deleted models used. With glibc's
# malloc underneath, the operator's malloc_trim after deletions (handlers/memory.py) returns free pages,
# and two arenas keep kopf's thread pool from multiplying heaps. hack/scale runs the operator alike.
ENV PYTHONMALLOC=malloc \
    MALLOC_ARENA_MAX=2
# Offline install from the build stage's wheels only: the image holds exactly what was built and tested,
# the dependencies hash-checked again against the lock.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    --mount=type=bind,from=build,source=/src/requirements,target=/requirements \
    pip install --no-index --find-links=/wheels --require-hashes -r /requirements/operator.lock \
    && pip install --no-index --no-deps /wheels/specdec_operator-*.whl
# A named user with a fixed numeric id: Kubernetes can verify runAsNonRoot only against a numeric USER,
# and kopf names its peering identity after the user when no POD_ID is set.
RUN useradd --system --no-log-init --uid 65532 --user-group --no-create-home --shell /usr/sbin/nologin specdec
USER 65532:65532
# 8080: the operator's /metrics. 8081: kopf's liveness endpoint.
EXPOSE 8080 8081
ENTRYPOINT ["specdec-operator"]
CMD ["run", "--liveness", "http://0.0.0.0:8081/healthz"]
