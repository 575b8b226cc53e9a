#!/usr/bin/env bash
# Download into .whl/ the wheels the H200 image lacks (Python 3.12, x86-64), for the device
# tool's `carry: [".whl"]`. There, install them first:
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD/service:$PWD/client
# The image has torch, triton, numpy, pyyaml, httpx, rich, prometheus-client, anyio, h11 (the
# IMAGE line; tests/unit/bench/test_gpu_wheels.py checks that every package the api and worker extras
# need, dependencies included, is in the image or in pkgs below).
# IMAGE: torch triton numpy pyyaml httpx rich prometheus-client anyio h11
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx "/.whl/" .git/info/exclude 2>/dev/null || echo "/.whl/" >> .git/info/exclude
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_34_x86_64)
pkgs=(
  pydantic==2.14.4 pydantic_core==2.50.5 pydantic-settings==2.16.3 annotated-types==0.8.0
  typing-inspection==0.4.5 typing-extensions python-dotenv==1.2.4
  fastapi==0.165.0 starlette==1.10.0 annotated-doc opentelemetry-api importlib-metadata zipp
  uvicorn==0.55.0 sqlalchemy==2.1.9 sse-starlette==3.7.1 python-multipart==0.0.34
  alembic mako markupsafe fastapi-offline httptools uvloop click
  grpcio==1.84.2 protobuf==7.36.2 grpcio-health-checking==1.84.2 grpcio-reflection==1.84.2
  grpcio-status==1.84.2 googleapis-common-protos
  liger-kernel==0.8.5 cut-cross-entropy==25.1.1 nvidia-ml-py packaging
  python-json-logger==4.2.0
)
for p in "${pkgs[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${plat[@]}" -d .whl "$p"
done
ls .whl
