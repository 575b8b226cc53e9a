# kassay — the two commands a user needs: `make run` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PORT ?= 8000
# pytest-xdist workers of `make test` (CI has two cores: tests took 1021 s serially, 713 s on 2)
TEST_WORKERS ?= 2

.PHONY: run demo test lint typecheck unit integration protos sdk check-protos deploy-check venv clean browser postgres

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch lies on local disk; a plain `torch` requirement would pull a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0 triton==3.9.0
	$(BIN)/python -m pip install -q -e '.[dev,all]'
	rm -f $(VENV)/.installed-*
	touch $(STAMP)

venv: $(STAMP)

lint: venv
	$(BIN)/ruff check service client tests bench research
	$(BIN)/ruff format --check service client tests bench research

typecheck: venv
	$(BIN)/mypy service/kassay client/kassay_client

check-protos: venv
	$(BIN)/python -m kassay.contract.protogen --check

# Headless Chromium for the dashboard's browser tests: Debian's package (Playwright drives it;
# never `playwright install`). Where it cannot be installed the tests skip and say why.
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	  && apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } \
	  || echo "chromium could not be installed: the dashboard's browser tests will skip"

test: venv postgres lint typecheck check-protos browser
	$(BIN)/python -m pytest -q -ra -m "not gpu" -n $(TEST_WORKERS) tests

# The deployment files alone (also part of `make test`, in tests/unit/test_deploy.py): the
# manifests against the Kubernetes 1.33 schema, the Dockerfile through hadolint.
deploy-check: venv
	$(BIN)/kubernetes-validate --strict --quiet -k 1.33.0 deploy/k8s/*.yaml
	$(BIN)/hadolint Dockerfile
	$(BIN)/python -m pytest -q tests/unit/test_deploy.py

unit: venv postgres
	$(BIN)/python -m pytest -q -ra tests/unit

# The PostgreSQL tests start a server of their own (tests/pgserver.py) from Debian's postgresql
# package: installed here when missing and apt-get can (as root); otherwise those tests skip,
# saying why.
postgres:
	@if command -v initdb >/dev/null || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
		echo "installing Debian's postgresql package for the PostgreSQL tests"; \
		(apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql) >/dev/null \
			|| echo "could not install postgresql: the PostgreSQL tests will skip"; \
	else echo "no PostgreSQL server binaries and no root apt-get: the PostgreSQL tests will skip"; fi

integration: venv postgres
	$(BIN)/python -m pytest -q -ra tests/integration

protos: venv
	$(BIN)/python -m kassay.contract.protogen

# The SDK's blocking client, generated from its async definition (kassay_client/_async/), and
# its response models, generated from the API's published schemas (OpenAPI, the report schema).
sdk: venv
	$(BIN)/python client/gen_sync.py
	$(BIN)/python client/gen_models.py

# The embedded default: API + local worker + SQLite; submits the smoke job and keeps serving.
run: venv
	$(BIN)/kassay demo --port $(PORT) --keep-serving examples/smoke.yaml

demo: venv
	$(BIN)/kassay demo --port $(PORT) examples/smoke.yaml

clean:
	rm -rf $(VENV) .kassay .mypy_cache .ruff_cache .pytest_cache
