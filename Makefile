# The verbs of the project; each is `python3 dev.py <verb>`, which needs nothing but Python
# 3.11+ and builds .venv on first use (see README.md).

PYTHON ?= python3
ARGS ?=

.PHONY: install install-dev up test bench lint format proto images clean

install:
	$(PYTHON) dev.py install

install-dev:
	$(PYTHON) dev.py install-dev

## Start the whole platform: embedded NATS and Postgres unless SUZUMIO_NATS_URL /
## SUZUMIO_DATABASE_URL are set, the five services, the API on http://127.0.0.1:8080.
up:
	$(PYTHON) dev.py up $(ARGS)

## Run the tests against real NATS and Postgres.
test:
	$(PYTHON) dev.py test $(ARGS)

## Measure the performance figures and print them as JSON.
bench:
	$(PYTHON) dev.py bench $(ARGS)

lint:
	$(PYTHON) dev.py lint

## Make sure a Docker engine answers (installing and starting one as root) and build the
## runner image suzumio-runner:latest offline (tools/runner_image.py).
images:
	$(PYTHON) dev.py images

format: install-dev
	.venv/bin/ruff format .
	.venv/bin/ruff check --fix .

## Regenerate proto/ (JSON Schemas and the AsyncAPI document) from the contracts.
proto:
	$(PYTHON) dev.py proto

clean:
	rm -rf .venv .mypy_cache .ruff_cache
