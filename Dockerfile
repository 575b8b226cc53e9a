# kassay images, one Dockerfile, two targets:
#
#   docker build --target api    -t kassay-api .      # REST API: no torch, no CUDA (~200 MB)
#   docker build --target worker -t kassay-worker .   # GPU worker (torch from PyPI: its Linux
#                                                     # wheels bring the CUDA libraries; the
#                                                     # driver comes from the host)
#
#   docker run -p 8000:8000 -e KASSAY_WORKERS=dns:///kassay-worker:50051 \
#       -e KASSAY_DATABASE_URL=postgresql+psycopg://... kassay-api
#   docker run --gpus all -e KASSAY_WORKER_TOKEN=... kassay-worker      # one GPU per worker
#   docker run --gpus all -p 8000:8000 kassay-worker serve --host 0.0.0.0 --gpus all
#
# The base image is pinned to an exact tag; pin its digest too where your registry policy asks
# (`docker buildx imagetools inspect python:3.11.13-slim-bookworm`), as --build-arg PYTHON_IMAGE.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    KASSAY_DATA_DIR=/data XDG_CACHE_HOME=/cache TRITON_CACHE_DIR=/cache/triton
WORKDIR /app
# A fixed numeric user (Kubernetes' runAsNonRoot checks the number); /data and /cache are the
# only paths it writes (volumes in deploy/k8s, so the root filesystem can stay read-only).
RUN useradd --create-home --uid 10001 --user-group kassay \
    && mkdir -p /data /cache && chown 10001:10001 /data /cache
COPY pyproject.toml README.md ./
COPY service ./service
COPY client ./client

FROM base AS api
# EXTRAS: the API and the PostgreSQL driver (psycopg 3) its replicas share a database through.
ARG EXTRAS=api,postgres
# DL3013 reads ".[api]" as an unpinned package; it is this source tree (its version is the one
# pyproject.toml says), installed with the dependency ranges pyproject.toml declares.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[${EXTRAS}]"
USER 10001:10001
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s \
    CMD ["python", "-c", "import sys, urllib.request as u; sys.exit(u.urlopen('http://127.0.0.1:8000/healthz', timeout=4).status != 200)"]
ENTRYPOINT ["kassay"]
CMD ["api", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS worker
ARG TORCH_VERSION=2.13.0
ARG TRITON_VERSION=3.9.0
# TORCH_INDEX_URL: a torch wheel index for another CUDA version (default: PyPI's build).
ARG TORCH_INDEX_URL=""
# torch and triton are pinned; ".[all]" is this source tree (see DL3013 in the api stage).
# hadolint ignore=DL3013
RUN if [ -n "${TORCH_INDEX_URL}" ]; then \
        pip install --no-cache-dir --index-url "${TORCH_INDEX_URL}" \
            "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}"; \
    else \
        pip install --no-cache-dir "torch==${TORCH_VERSION}" "triton==${TRITON_VERSION}"; \
    fi \
    && pip install --no-cache-dir ".[all]"
COPY examples ./examples
USER 10001:10001
# gRPC, and Prometheus /metrics (KASSAY_WORKER_METRICS_LISTEN)
EXPOSE 50051 9400
# No HEALTHCHECK: the worker speaks grpc.health.v1 (Kubernetes' grpc probes; the API watches
# its workers itself), and a SIGTERM drains the running case (allow KASSAY_WORKER_SHUTDOWN_GRACE_S).
ENTRYPOINT ["kassay"]
CMD ["worker", "--listen", "0.0.0.0:50051", "--device", "cuda:0", "--metrics-listen", "0.0.0.0:9400"]
