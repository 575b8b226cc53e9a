# kassay: one image for the API and the worker (the command picks the role).
#
#   docker build -t kassay .                                   # CPU torch from PyPI
#   docker build -t kassay:cuda --build-arg BASE_IMAGE=<a CUDA runtime image with python3.11> \
#       --build-arg TORCH_INDEX_URL=<the torch wheel index for that CUDA> .
#
#   docker run -p 8000:8000 kassay serve --host 0.0.0.0       # API + local worker + SQLite
#   docker run kassay worker --listen 0.0.0.0:50051 --device cuda:0
#   docker run -p 8000:8000 -e KASSAY_WORKERS=w1:50051,w2:50051 kassay api --host 0.0.0.0
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ARG TORCH_SPEC="torch triton"
ARG TORCH_INDEX_URL=""
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    KASSAY_DATA_DIR=/data KASSAY_DATABASE_URL=sqlite:////data/kassay.db

WORKDIR /app
RUN if [ -n "$TORCH_INDEX_URL" ]; then \
        pip install --index-url "$TORCH_INDEX_URL" $TORCH_SPEC; \
    else pip install $TORCH_SPEC; fi
COPY pyproject.toml README.md* ./
COPY service ./service
COPY client ./client
COPY examples ./examples
RUN pip install '.[all]' \
    && useradd --create-home --uid 10001 kassay && mkdir -p /data && chown kassay /data
USER kassay
VOLUME ["/data"]
EXPOSE 8000 50051
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD python -c "import sys,urllib.request as u; sys.exit(0 if u.urlopen('http://127.0.0.1:8000/healthz').status == 200 else 1)" || exit 1
ENTRYPOINT ["kassay"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8000"]
