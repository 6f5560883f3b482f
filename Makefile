# holdfast — developer entry points. `make demo` and `make test` are the two the README promises.
SHELL := /bin/bash
STATE := .holdfast
CARGO ?= cargo

.PHONY: deps deps-demo build up cluster down demo test lint fmt fuzz-smoke bench-admission bench-apiserver bench-scale bench-deletion bench-pinning bench-mirror soak

## deps: install the registry, skopeo, shellcheck; build and cache Kubernetes 1.37, etcd, kwok and the peers from their Go modules
deps:
	@scripts/install-deps.sh

build:
	$(CARGO) build --workspace --bins

## deps-demo: only what make up and make demo run (install-deps.sh --demo: no kpack, Korifi or
## release-tool builds; their CRDs come from module source)
deps-demo:
	@scripts/install-deps.sh --demo

## up: start the local control plane + registry in the background; writes $(STATE)/env. The demo's
## Go builds and cargo's build of holdfast run side by side (a first run is mostly the two).
up:
	@$(MAKE) --no-print-directory -j2 deps-demo build
	@scripts/up.sh $(STATE)

## cluster: the control plane of `make up` without holdfast's and kapp-controller's host processes,
## plus one real node (scripts/node.sh: containerd, runc, CNI bridge, kubelet, kube-proxy,
## kube-router; tainted holdfast.dev/real-node), kapp-controller as a pod there from an image built
## here and its own release config (scripts/kapp-controller.sh), and holdfast installed onto it from
## its image and chart (scripts/install.sh: make image, helm install); writes $(STATE)/env as make
## up does, and $(STATE)/node/env
cluster:
	@$(MAKE) --no-print-directory -j2 deps-demo build
	@scripts/install-deps.sh --node
	@scripts/install-deps.sh --release-tools
	@scripts/up.sh $(STATE) --without-holdfast --without-kapp-controller
	@scripts/node.sh up $(STATE)
	@scripts/kapp-controller.sh up $(STATE)
	@scripts/install.sh $(STATE)

## down: stop everything `make up` and `make cluster` started
down:
	@scripts/node.sh down $(STATE)
	@scripts/down.sh $(STATE)

## demo: up, push the demo images, apply examples/, show what holdfast did to them
demo: up
	@scripts/demo.sh $(STATE)

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	shellcheck e2e/kind/*.sh scripts/*.sh

fmt:
	$(CARGO) fmt --all

## test: formatting, lints, every test (unit, in-process and e2e on the local control plane), and
## a few seconds of every fuzz target; what deps builds runs meanwhile (scripts/test.sh)
test:
	@CARGO=$(CARGO) scripts/test.sh

## fuzz-smoke: every fuzz target (fuzz/) for FUZZ_SECONDS (5) from its committed corpus; installs
## cargo-fuzz from crates.io once if missing. Long runs: scripts/fuzz.sh run TARGET SECONDS
FUZZ_SECONDS ?= 5
fuzz-smoke:
	@scripts/fuzz.sh smoke $(FUZZ_SECONDS)

## instructions: callgrind's instructions per admission through the handler (a cached pin, an
## allowed review, the bare handler) against webhook/examples/admission_instructions.baseline;
## fails past +10 % (make test runs it). instructions-baseline: count and write the baseline
.PHONY: instructions instructions-baseline
instructions:
	@scripts/instructions.sh build
	@scripts/instructions.sh check
instructions-baseline:
	@scripts/instructions.sh build
	@scripts/instructions.sh baseline

## plots: BENCHMARKS.md's plots, docs/benchmarks/*.svg, drawn from the CSV files every bench-* writes
## into docs/benchmarks/data/ (scripts/plot-benchmarks.py, matplotlib pinned); make test checks them
.PHONY: plots
plots:
	@scripts/plots.sh

## bench-admission: holdfast vs a bare axum+rustls handler over TLS; last line ratio=… p99_ms=… rss_mib=…
bench-admission:
	$(CARGO) run --release -q -p holdfast-e2e --bin holdfast-bench-admission

## bench-apiserver: App CREATE/UPDATE, kpack Build CREATE and build-pod CREATE through the real kube-apiserver at
## concurrency 1, 16, 64: holdfast (the release holdfast-webhook, shipped configurations) vs a bare allow-all webhook
## with the same configurations vs that webhook answering App CREATE with holdfast's patch vs no webhook vs the
## pinning policy (App CREATE pinned inside the API server) vs a constant policy patch (its floor), in alternating
## turns; last line create_p50_overhead_ms=… throughput_ratio_c16=… vs_bare_webhook_c16=… p99_c64_ms=… …
## policy_vs_none_c16=… policy_vs_patch_floor_c16=… policy_create_p50_overhead_ms=… … policy_vs_policy_floor_c16=…
bench-apiserver: deps
	$(CARGO) build --release -q -p holdfast-webhook -p holdfast-controller -p holdfast-e2e --bin holdfast-webhook --bin holdfast-controller --bin holdfast-bench-apiserver
	target/release/holdfast-bench-apiserver

## bench-scale: RSS, CPU per write, restart-to-ready and admission p99 of the release holdfast-webhook and
## holdfast-controller as the cluster grows through BENCH_SCALE_LEVELS (1000,10000,100000 objects: Apps with kapp-sized
## statuses, PackageRepositories, kpack Images and Builds, pods); last line webhook_rss_mib=… controller_rss_mib=…
## ready_s=… admission_p99_ratio=…
bench-scale: deps
	$(CARGO) build --release -q -p holdfast-webhook -p holdfast-controller -p holdfast-e2e --bin holdfast-webhook --bin holdfast-controller --bin holdfast-bench-scale
	target/release/holdfast-bench-scale

## bench-deletion: Korifi org deletion on the real Korifi v0.18.0 + kpack v0.16.1/v0.17.1: N apps (BENCH_DELETION_APPS,
## default 1,10,50) x without/with holdfast/with --delete-org-spaces, the no-churn and empty-org floors, BENCH_DELETION_REPEATS (3)
## times each; last line speedup_n10_v016=… created_after_delete_with=… with_over_nochurn_n10=… with_over_nochurn_n50=… with_over_empty_n10=…
bench-deletion:
	@scripts/install-deps.sh --bench
	$(CARGO) run --release -q -p holdfast-e2e --bin holdfast-bench-deletion

## bench-pinning: registry requests and failed syncs in a registry outage of 200 Apps over 10 tags (BENCH_PINNING_APPS,
## BENCH_PINNING_TAGS) reconciled by the real kapp-controller, BENCH_PINNING_MINUTES (20) + BENCH_PINNING_OUTAGE_MINUTES (5)
## per arm, without holdfast, with it, and with it and its mirror (an upstream and a mirror registry, the upstream
## stopped); last line registry_request_ratio=… failed_syncs_without=… failed_syncs_with=… steady_state_ratio=… …
## upstream_request_ratio_mirror=… failed_syncs_with_mirror=… … clusters=… upstream_per_tag_per_refresh_…=… (about 80
## minutes); BENCH_PINNING_CLUSTERS=N: a fleet of N control planes, each with its kapp-controller, holdfast and mirror,
## sharing one upstream registry (BENCH_PINNING_APPS Apps each)
bench-pinning:
	$(CARGO) run --release -q -p holdfast-e2e --bin holdfast-bench-pinning

## bench-mirror: copy throughput (MiB/s) of holdfast's mirror copier vs `skopeo copy` of the same image (BENCH_MIRROR_MIB,
## default 200, in BENCH_MIRROR_LAYERS layers) between two local registries, BENCH_MIRROR_ROUNDS alternating rounds, then a
## fetch of the mirrored image with the upstream stopped; last line copy_ratio=… upstream_requests_after_outage=…
bench-mirror:
	$(CARGO) build --release -q -p holdfast-e2e --bin holdfast-mirror-copy
	$(CARGO) run --release -q -p holdfast-e2e --bin holdfast-bench-mirror

## soak: SOAK_MINUTES (120) of Apps and PackageRepositories created, updated and deleted over 30 moving tags with a fault
## injector cycling (registry stopped / 503 / 429, kube-apiserver restarted, etcd SIGKILLed, the leader's API link cut, a
## webhook or controller replica SIGKILLed, the serving certificate rotated) and invariants checked all along; holdfast
## as the chart's release on make cluster's real node (two webhook and two controller pods), or with SOAK_ON=processes
## as make up's host processes;
## last line minutes=… faults=…
## violations=0 rss_slope_mib_per_h_webhook=… rss_slope_mib_per_h_controller=… admissions=…
## failed_admissions_outside_apiserver_down=0 …; exits non-zero on a violation; the resource samples in SOAK_SAMPLES
## (.holdfast/soak-samples.csv)
SOAK_MINUTES ?= 120
SOAK_SAMPLES ?= .holdfast/soak-samples.csv
SOAK_ON ?= node
soak: deps
	@if [ "$(SOAK_ON)" = node ]; then scripts/install-deps.sh --node && scripts/install-deps.sh --release-tools; fi
	$(CARGO) build -q -p holdfast-webhook -p holdfast-controller -p holdfast-e2e --bin holdfast-webhook --bin holdfast-controller --bin holdfast-soak
	SOAK_MINUTES=$(SOAK_MINUTES) SOAK_SAMPLES=$(SOAK_SAMPLES) SOAK_ON=$(SOAK_ON) target/debug/holdfast-soak

## image: the container image of holdfast's binaries (and the kubectl plugin), without a Docker engine (scripts/image.sh: static
## musl binaries, umoci): an OCI layout in target/image/oci and, tagged $(IMAGE), the archive
## target/image/holdfast.tar (kind load image-archive); pushed to $(IMAGE_REPO) by digest when set
## (after `source .holdfast/env`: the local registry of `make up`)
IMAGE ?= holdfast:dev
IMAGE_REPO ?= $(if $(HOLDFAST_REGISTRY),$(HOLDFAST_REGISTRY)/holdfast)
.PHONY: image sbom sign package plugin
## plugin: kubectl holdfast, a static release build (target/image/kubectl-holdfast): put it on PATH
plugin:
	@scripts/image.sh binaries
	@echo "target/image/kubectl-holdfast (copy it into a directory on PATH; then: kubectl holdfast --help)"

image:
	@scripts/image.sh build
	@scripts/image.sh archive $(IMAGE) >/dev/null
	@if [ -n "$(IMAGE_REPO)" ]; then scripts/image.sh push $(IMAGE_REPO); fi

## sbom: CycloneDX SBOMs of the image's three binaries (target/image/sbom/)
sbom:
	@scripts/sign.sh sbom

## sign: cosign signature and SBOM attestations for the pushed image (target/image/pushed) with
## COSIGN_KEY (password in COSIGN_PASSWORD); README "Verifying a release"
COSIGN_KEY ?= cosign.key
sign: sbom
	@scripts/sign.sh sign "$$(cat target/image/pushed)" $(COSIGN_KEY)

## package: image pushed to $(PREFIX)/holdfast, then the Carvel package and repository bundles
## and the OCI chart under $(PREFIX) (scripts/package.sh)
PREFIX ?=
package:
	@[ -n "$(PREFIX)" ] || { echo "make package: set PREFIX=registry/path (e.g. PREFIX=\$$HOLDFAST_REGISTRY/holdfast)" >&2; exit 1; }
	@$(MAKE) --no-print-directory image IMAGE_REPO=$(PREFIX)/holdfast
	@scripts/package.sh $(PREFIX)
