# holdfast — developer entry points. `make demo` and `make test` are the two the README promises.
SHELL := /bin/bash
STATE := .holdfast
CARGO ?= cargo

.PHONY: deps build up down demo test lint fmt bench-admission

## deps: install etcd, the registry, skopeo, Go; build and cache kube-apiserver/controller-manager 1.20.2
deps:
	@scripts/install-deps.sh

build:
	$(CARGO) build --workspace --bins

## up: start the local control plane + registry in the background; writes $(STATE)/env
up: deps build
	@scripts/up.sh $(STATE)

## down: stop everything `make up` started
down:
	@scripts/down.sh $(STATE)

## demo: up, push the demo images, apply examples/, show what holdfast did to them
demo: up
	@scripts/demo.sh $(STATE)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## test: formatting, lints, and every test (unit, in-process and e2e on the local control plane)
test: deps lint
	$(CARGO) test --workspace

## bench-admission: holdfast vs a bare axum+rustls handler over TLS; last line ratio=… p99_ms=… rss_mib=…
bench-admission:
	$(CARGO) run --release -q -p holdfast-e2e --bin holdfast-bench-admission
