# fp16audit build. `make demo` and `make test` work on a fresh machine: both
# install the ONNX Runtime library first (into .ort/, git-ignored).

ORT_VERSION := 1.30.0
ORT_DIR     := $(CURDIR)/.ort
ORT_LIB     := $(ORT_DIR)/libonnxruntime.so.1
ORT_SHA256  := ffb75a925ba05e47b235bb66e3e3911714a80b328a9c9425539feb204aa32a23
ORT_MEMBER  := package/bin/napi-v6/linux/x64/libonnxruntime.so.1

PROTOC_GEN_GO_VERSION := v1.36.12
STATICCHECK_VERSION   := v0.8.2
TOOLS := $(CURDIR)/.tools/bin
STATICCHECK := $(TOOLS)/staticcheck

GO      ?= go
BIN     := bin/fp16audit
# The Python companion's tests need torch: Debian's python3-torch is
# installed for /usr/bin/python3 (a python3 earlier on PATH may lack it).
# They include the offline install into a fresh virtualenv
# (python3-venv, python3-setuptools, python3-wheel).
PYTHON_TORCH ?= /usr/bin/python3
# The Python package's tests run in a virtualenv of PYTHON_TORCH (it sees
# Debian's torch 1.13 and torchvision) with real fastai 2.7 and onnxruntime
# from the package index, every package pinned in
# python/requirements-test.txt; `make pyvenv` makes it once.
PYVENV := .venv-py
PYVENV_OK := $(PYVENV)/.installed
export ONNXRUNTIME_LIB ?= $(ORT_LIB)

.PHONY: all ort build test test-torch2 docs docs-gen docs-venv demo bench bench-audit bench-peers llama-bench llama8b proto fixtures fixtures-torch2 fixtures-trained fuzz conformance vet staticcheck clean wheel pyvenv torch2-venv

all: build

# ort fetches the official ONNX Runtime linux-x64 build from the npm package
# onnxruntime-node (npm pack runs no install scripts), keeps only the shared
# library and checks its sha256. Nothing happens when it is already installed.
ort: $(ORT_LIB)

$(ORT_LIB):
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    echo "make ort: installing npm with apt-get"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq npm >/dev/null; \
	  else echo "make ort: npm is required (apt-get install npm)"; exit 1; fi; }
	@mkdir -p $(ORT_DIR)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  echo "fetching onnxruntime-node@$(ORT_VERSION) from the npm registry" && \
	  (cd "$$tmp" && npm pack --silent onnxruntime-node@$(ORT_VERSION) >/dev/null) && \
	  tar -xzf "$$tmp"/onnxruntime-node-$(ORT_VERSION).tgz -C "$$tmp" $(ORT_MEMBER) && \
	  echo "$(ORT_SHA256)  $$tmp/$(ORT_MEMBER)" | sha256sum -c --quiet - && \
	  install -m 0644 "$$tmp"/$(ORT_MEMBER) $(ORT_LIB).tmp && mv $(ORT_LIB).tmp $(ORT_LIB) && \
	  echo "installed $(ORT_LIB)"

build:
	$(GO) build -o $(BIN) ./cmd/fp16audit

test: ort $(STATICCHECK) build
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	@test -z "$$($(GO) mod tidy -diff)" || { echo "go.mod/go.sum not tidy: run go mod tidy"; $(GO) mod tidy -diff; exit 1; }
	$(STATICCHECK) ./...
	$(GO) test -count=1 ./...
	@if $(PYTHON_TORCH) -c 'import torch, torchvision, venv, ensurepip' 2>/dev/null; then \
	  $(MAKE) --no-print-directory pyvenv && \
	  echo "$(PYVENV)/bin/python -m unittest discover -s python/tests" && \
	  $(PYVENV)/bin/python -m unittest discover -s python/tests; \
	elif [ -n "$$CI" ]; then \
	  echo "make test: $(PYTHON_TORCH) lacks torch, torchvision or venv, and CI must run the Python package's tests (apt-get install python3-torch python3-torchvision python3-venv)"; exit 1; \
	else \
	  echo "make test: skipped the Python package's tests: $(PYTHON_TORCH) lacks torch, torchvision or venv (apt-get install python3-torch python3-torchvision python3-venv)"; \
	fi

# pyvenv: the Python tests' virtualenv (see PYVENV above); remade when the
# pins change.
pyvenv: $(PYVENV_OK)

$(PYVENV_OK): python/requirements-test.txt
	rm -rf $(PYVENV)
	$(PYTHON_TORCH) -m venv --system-site-packages $(PYVENV)
	$(PYVENV)/bin/pip install -q --no-deps -r python/requirements-test.txt
	touch $@

# test-torch2: the second Python leg, on the stack users run: torch 2.x,
# fastai 2.8 and the dynamo exporter from the package index, every package
# pinned in python/requirements-torch2.txt. The whole Python suite runs
# there (a test that skips on torch 1.x fails here: FP16AUDIT_TEST_LEG),
# then the truth drift (fixtures/torch/drift.py: a sample of the dynamo
# fixtures rebuilt, exported and judged by this torch, against the
# committed truth), and the Go truth harness on those fresh exports
# (TestTorchTruthDir). The virtualenv (about 5 GB) is made once per machine
# in $(TORCH2_TEST_VENV), named after the pins and the interpreter, so CI
# on the same machine reuses it; a cold one takes a few minutes to make.
TORCH2_TEST_PY   ?= python3
TORCH2_TEST_REQ  := python/requirements-torch2.txt
TORCH2_TEST_HOME ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/fp16audit
TORCH2_TEST_VENV ?= $(TORCH2_TEST_HOME)/venv-torch2-$(shell { cat $(TORCH2_TEST_REQ); $(TORCH2_TEST_PY) -c 'import sys; print(sys.version)' 2>/dev/null; } | sha256sum | cut -c1-12)

torch2-venv: $(TORCH2_TEST_VENV)/.installed

$(TORCH2_TEST_VENV)/.installed: $(TORCH2_TEST_REQ)
	@mkdir -p $(TORCH2_TEST_HOME)
	@# an older set of pins leaves an older virtualenv: one is kept
	@find $(TORCH2_TEST_HOME) -maxdepth 1 -name 'venv-torch2-*' ! -path '$(TORCH2_TEST_VENV)' -exec rm -rf {} +
	rm -rf $(TORCH2_TEST_VENV)
	$(TORCH2_TEST_PY) -m venv $(TORCH2_TEST_VENV)
	$(TORCH2_TEST_VENV)/bin/pip install -q --no-deps -r $(TORCH2_TEST_REQ)
	touch $@

test-torch2: ort build torch2-venv
	@echo "$(TORCH2_TEST_VENV)/bin/python -m unittest discover -s python/tests"
	@FP16AUDIT_TEST_LEG=torch2 $(TORCH2_TEST_VENV)/bin/python -m unittest discover -s python/tests
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	  echo "$(TORCH2_TEST_VENV)/bin/python fixtures/torch/drift.py --out $$tmp" && \
	  $(TORCH2_TEST_VENV)/bin/python -W ignore fixtures/torch/drift.py --out "$$tmp" && \
	  echo "FP16AUDIT_TRUTH_DIR=$$tmp $(GO) test -count=1 -run TestTorchTruthDir ./internal/audit/" && \
	  FP16AUDIT_TRUTH_DIR="$$tmp" $(GO) test -count=1 -run TestTorchTruthDir ./internal/audit/

# docs builds the documentation site (mkdocs.yml, docs/) strictly into
# site/ (git-ignored): a broken link, a missing page or a reference that
# does not resolve fails it. The pages under docs/reference/ are generated
# from the code and the fixtures by internal/docgen and committed; `make
# test` fails when one is stale (TestGenerated), and `make docs-gen`
# rewrites them. The Python API page is rendered at build time from the
# docstrings (mkdocstrings). The site's tools are pinned in
# docs/requirements.txt, installed once per machine into $(DOCS_VENV); then
# headless Chromium opens a few built pages (TestSite).
DOCS_REQ  := docs/requirements.txt
DOCS_VENV ?= $(TORCH2_TEST_HOME)/venv-docs-$(shell { cat $(DOCS_REQ); $(TORCH2_TEST_PY) -c 'import sys; print(sys.version)' 2>/dev/null; } | sha256sum | cut -c1-12)
DOCS_SITE := site

docs-venv: $(DOCS_VENV)/.installed

$(DOCS_VENV)/.installed: $(DOCS_REQ)
	@mkdir -p $(TORCH2_TEST_HOME)
	@find $(TORCH2_TEST_HOME) -maxdepth 1 -name 'venv-docs-*' ! -path '$(DOCS_VENV)' -exec rm -rf {} +
	rm -rf $(DOCS_VENV)
	$(TORCH2_TEST_PY) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install -q --no-deps -r $(DOCS_REQ)
	touch $@

docs: ort build docs-venv
	$(GO) test -count=1 -run 'TestGenerated' ./internal/docgen/
	$(DOCS_VENV)/bin/mkdocs build --strict --clean --site-dir $(DOCS_SITE)
	FP16AUDIT_SITE_DIR=$(CURDIR)/$(DOCS_SITE) $(GO) test -count=1 -run 'TestSite' ./internal/docgen/

# docs-gen rewrites the generated pages under docs/reference/ (run it after
# changing a check, a verdict, a command's flags, a schema, an operator
# entry or a fixture the pages show).
docs-gen: ort build
	$(GO) test -count=1 -run 'TestGenerated' ./internal/docgen/ -update

# wheel: the platform wheel, the Python package with the binary in its
# scripts (python/build_wheel.py), into dist/: pip install it with
# onnxruntime and `fp16audit` and fp16audit.audit work (python/README.md).
wheel:
	CGO_ENABLED=1 $(GO) build -trimpath -ldflags="-s -w" -o dist/fp16audit ./cmd/fp16audit
	$(PYTHON_TORCH) python/build_wheel.py --binary dist/fp16audit --out dist
	@rm -f dist/fp16audit

# staticcheck is installed from the Go module proxy into .tools/ (ignored).
$(STATICCHECK):
	GOBIN=$(TOOLS) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)

staticcheck: $(STATICCHECK)
	$(STATICCHECK) ./...

# demo audits a model that overflows fp16; fp16audit exits 1 for that
# (findings at error level), which is the expected outcome here.
demo: ort build
	@./$(BIN) run fixtures/models/demo_cnn.onnx -i fixtures/batches/demo_cnn_raw.npy; \
	  code=$$?; echo; echo "fp16audit exited $$code (1: findings at error level, as expected for this model)"; \
	  test $$code -eq 1

# bench: the statistics kernels (GB/s, Go against C and AVX2), lint of a
# 100 MB model, then the audit against plain ONNX Runtime inference of the
# same models and batches in the same run: time, peak memory, and a batch
# over --max-memory (see docs/performance.md), then the training audit
# against the forward audit of the same models, and the replay of the run
# fixtures' captures against the training audit of the same step
# (FP16AUDIT_BENCH_CAPTURE: a larger one, from python/bench_capture.py --keep).
# Every benchmark runs BENCH_COUNT times. The output, in Go's benchmark
# format (benchstat reads it), is kept in BENCH_OUT with the date, the
# machine, the load average before and after, and the versions as
# configuration lines; it is committed, docs/reference/benchmarks.md is
# generated from it (make docs-gen) and TestGenerated holds the page to it.
# The file is replaced only when every benchmark ran. Then fp16audit.audit()
# from Python (bench-audit), which prints its own table.
BENCH_OUT   ?= bench/results.txt
BENCH_COUNT ?= 1
bench: SHELL := /bin/bash
bench: .SHELLFLAGS := -eo pipefail -c
bench: ort llama-bench
	@mkdir -p $(dir $(BENCH_OUT))
	@{ echo "date: $$(date -u +%Y-%m-%dT%H:%M:%SZ)"; \
	   echo "machine: $$(nproc) cores, $$(awk '/MemTotal/ {printf "%.0f GiB", $$2/1048576}' /proc/meminfo), $$(uname -sr)"; \
	   echo "load-average: $$(cut -d' ' -f1-3 /proc/loadavg)"; \
	   echo "go: $$($(GO) env GOVERSION)"; echo "onnxruntime: $(ORT_VERSION)"; \
	   echo "bench-count: $(BENCH_COUNT)"; } > $(BENCH_OUT).tmp
	$(GO) test -run '^$$' -bench 'Kernel' -benchtime 1s -count $(BENCH_COUNT) ./internal/statsop/ | tee -a $(BENCH_OUT).tmp
	$(GO) test -run '^$$' -bench 'Lint100MB' -benchtime 1x -count $(BENCH_COUNT) ./internal/lint/ | tee -a $(BENCH_OUT).tmp
	$(GO) test -run '^$$' -bench 'FullAudit|ReferencePass|Memory|Budget|Exporters' -benchtime 1x -count $(BENCH_COUNT) -timeout 30m ./internal/audit/ | tee -a $(BENCH_OUT).tmp
	$(GO) test -run '^$$' -bench 'TrainingAudit' -benchtime 1x -count $(BENCH_COUNT) ./internal/audit/ | tee -a $(BENCH_OUT).tmp
	$(GO) test -run '^$$' -bench 'Replay' -benchtime 3x -count $(BENCH_COUNT) ./internal/audit/ | tee -a $(BENCH_OUT).tmp
	$(GO) test -run '^$$' -bench 'LLM' -benchtime 1x -count $(BENCH_COUNT) -timeout 60m ./internal/audit/ | tee -a $(BENCH_OUT).tmp
	@echo "load-average-after: $$(cut -d' ' -f1-3 /proc/loadavg)" >> $(BENCH_OUT).tmp
	@mv $(BENCH_OUT).tmp $(BENCH_OUT)
	@echo "wrote $(BENCH_OUT): make docs-gen writes docs/reference/benchmarks.md from it"
	$(MAKE) --no-print-directory bench-audit

# bench-audit: what fp16audit.audit() costs on 14 torchvision architectures
# (python/bench_audit.py): the export, the binary and the rest, the median
# and the export's share, a second audit of the same weights, and
# PyTorch's own forward beside them; on torch 1.13 (.venv-py) and, where
# make torch2-venv made it, torch 2.x.
bench-audit: ort build pyvenv
	$(PYVENV)/bin/python -W ignore python/bench_audit.py
	@if [ -x $(TORCH2_TEST_VENV)/bin/python ]; then \
	  echo "$(TORCH2_TEST_VENV)/bin/python python/bench_audit.py"; \
	  $(TORCH2_TEST_VENV)/bin/python -W ignore python/bench_audit.py; \
	else echo "bench-audit: no torch 2.x virtualenv at $(TORCH2_TEST_VENV) (make torch2-venv makes it): torch 1.13 alone"; fi

# bench-peers runs fp16audit beside the tools a user would pick instead
# (Polygraphy, onnxconverter-common, ModelOpt AutoCast, a PyTorch hooks
# script on real fp16 CPU kernels) on the same models and batches, each
# whole process, 3 runs, graded against PyTorch's truth, and writes
# docs/peers.md (bench/peers/run.py). Its virtualenv (bench/peers/
# requirements.txt, about 6 GB with torch's CUDA wheel) is made once in
# ~/.cache/fp16audit/; the models' inputs for every peer and the peers'
# outputs go to fixtures/bench/peers/ (git-ignored). Never in CI: about
# half an hour on 2 cores.
PEERS_REQ  := bench/peers/requirements.txt
PEERS_VENV ?= $(TORCH2_TEST_HOME)/venv-peers-$(shell { cat $(PEERS_REQ); $(TORCH2_TEST_PY) -c 'import sys; print(sys.version)' 2>/dev/null; } | sha256sum | cut -c1-12)

$(PEERS_VENV)/.installed: $(PEERS_REQ)
	@mkdir -p $(TORCH2_TEST_HOME)
	@find $(TORCH2_TEST_HOME) -maxdepth 1 -name 'venv-peers-*' ! -path '$(PEERS_VENV)' -exec rm -rf {} +
	rm -rf $(PEERS_VENV)
	$(TORCH2_TEST_PY) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/pip install -q --no-deps -r $(PEERS_REQ)
	touch $@

bench-peers: ort build $(PEERS_VENV)/.installed
	$(PEERS_VENV)/bin/python -W ignore bench/peers/run.py --work fixtures/bench/peers --out docs/peers.md

# llama-bench generates the large-model benchmark (BenchmarkLLM): a ~600 M
# parameter Llama-style decoder with 2.4 GB of external data and a planted
# massive activation, into the git-ignored fixtures/bench/llama/, and the
# same decoder without the plant into fixtures/bench/llama_healthy/ (a few
# minutes and ~8 GB of memory each, once). Without torch the benchmark says
# how to make it and is skipped.
LLAMA_BENCH := fixtures/bench/llama/model.onnx
LLAMA_HEALTHY := fixtures/bench/llama_healthy/model.onnx
LLAMA_BF16 := fixtures/bench/llama_bf16/model.onnx
llama-bench:
	@if [ -f $(LLAMA_BENCH) ] && [ -f $(LLAMA_HEALTHY) ]; then :; \
	elif $(PYTHON_TORCH) -c 'import torch, onnx' 2>/dev/null; then \
	  if [ ! -f $(LLAMA_BENCH) ]; then echo "$(PYTHON_TORCH) fixtures/bench/llama_export.py"; $(PYTHON_TORCH) fixtures/bench/llama_export.py; fi; \
	  if [ ! -f $(LLAMA_HEALTHY) ]; then echo "$(PYTHON_TORCH) fixtures/bench/llama_export.py --healthy --out fixtures/bench/llama_healthy"; \
	    $(PYTHON_TORCH) fixtures/bench/llama_export.py --healthy --out fixtures/bench/llama_healthy; fi; \
	else echo "make bench: $(PYTHON_TORCH) has no torch and onnx, so BenchmarkLLM is skipped (apt-get install python3-torch python3-onnx)"; fi
	@if [ -f $(LLAMA_BF16) ]; then :; \
	elif $(PYTHON_TORCH) -c 'import torch, onnx' 2>/dev/null; then \
	  echo "$(PYTHON_TORCH) fixtures/bench/llama8b.py --preset medium"; $(PYTHON_TORCH) fixtures/bench/llama8b.py --preset medium; \
	else echo "make bench: $(PYTHON_TORCH) has no torch and onnx, so BenchmarkLLMBF16 is skipped"; fi

# llama8b writes the decoder at Llama-3-8B's shapes, its weights in bf16
# as external data (16 GB on disk, ~3 GB of memory while it writes), into
# the git-ignored fixtures/bench/llama8b/ (fixtures/bench/llama8b.py),
# which BenchmarkLLM8B audits under --max-memory 12G when it is there
# (make bench does not write 16 GB by itself).
llama8b:
	$(PYTHON_TORCH) fixtures/bench/llama8b.py

# fixtures-torch2 regenerates the real-PyTorch fixtures exported the way
# torch 2.x users export (torch.onnx.export(..., dynamo=True), the default
# since torch 2.9) into fixtures/torch/cases_dynamo, the same cases through
# torch 2.9's TorchScript exporter (dynamo=False) into
# fixtures/torch/cases_torchscript2, and the Hugging Face
# architectures of fixtures/torch/cases_hf.py (transformers, small configs,
# random init) into fixtures/torch/cases_hf, and the export
# recipes, run verbatim on real fastai learners and transformers models
# (fixtures/torch/recipes.py), into fixtures/torch/recipes, with PyTorch's truth from
# torch 2.9 itself (fixtures/torch/oracle.py). It makes .venv-torch2
# once: torch's Linux wheel from the package index is a CUDA build of
# several GB (about 7 GB installed), so this is a developer's target; CI and
# `make test` use the committed files and never need torch 2.x.
TORCH2_VENV := .venv-torch2
TORCH2_PY   ?= python3
TORCH2_PINS := torch==2.9.1 torchvision==0.24.1 onnx==1.23.2 onnxscript==0.7.2 onnx-ir==1.1.0 ml_dtypes==0.7.0 numpy==2.4.6 \
  transformers==5.24.0 huggingface_hub==2.4.0 tokenizers==0.23.3 safetensors==0.8.0 \
  fastai==2.8.12 fastcore==2.2.41 fasttransform==0.0.5 pandas==3.1.1 pillow==13.0.0 plum-dispatch==2.9.0 \
  scikit-learn==1.9.1 spacy==3.8.18

fixtures-torch2:
	@test -x $(TORCH2_VENV)/bin/python || $(TORCH2_PY) -m venv $(TORCH2_VENV)
	$(TORCH2_VENV)/bin/pip install -q $(TORCH2_PINS)
	$(TORCH2_VENV)/bin/python fixtures/torch/realcases.py --exporter dynamo --out fixtures/torch/cases_dynamo
	$(TORCH2_VENV)/bin/python fixtures/torch/realcases.py --exporter torchscript --out fixtures/torch/cases_torchscript2
	$(TORCH2_VENV)/bin/python fixtures/torch/realcases.py --exporter dynamo --family hf --out fixtures/torch/cases_hf
	$(TORCH2_VENV)/bin/python fixtures/torch/realcases.py --exporter dynamo --family recipes --out fixtures/torch/recipes
	$(TORCH2_VENV)/bin/python fixtures/torch/dynamo_train.py
	$(TORCH2_VENV)/bin/python fixtures/torch/train/gen.py --exporter dynamo

# fixtures-trained regenerates issue 41's front-door fixtures: trained-
# BatchNorm CNNs, folded and as fp16audit.audit() exports them
# (fixtures/torch/cases_trained.py), and recurrent and sequence-first models
# with their state (cases_stateful.py), and models whose chunk and split
# the dynamo exporter without its optimizer writes as sequences
# (cases_seq.py); the TorchScript families with
# Debian's torch 1.13 (PYTHON_TORCH, which needs python3-onnx), the dynamo
# families with the torch 2.x of make test-torch2's virtualenv, each with
# that torch's truth.
fixtures-trained: torch2-venv
	$(PYTHON_TORCH) fixtures/torch/realcases.py --family trained --out fixtures/torch/cases_trained
	$(PYTHON_TORCH) fixtures/torch/realcases.py --family stateful --out fixtures/torch/cases_stateful
	$(TORCH2_TEST_VENV)/bin/python -W ignore fixtures/torch/realcases.py --family trained --exporter dynamo --out fixtures/torch/cases_trained_dynamo
	$(TORCH2_TEST_VENV)/bin/python -W ignore fixtures/torch/realcases.py --family stateful --exporter dynamo --out fixtures/torch/cases_stateful_dynamo
	$(TORCH2_TEST_VENV)/bin/python -W ignore fixtures/torch/realcases.py --family seq --exporter dynamo --out fixtures/torch/cases_seq_dynamo

proto:
	GOBIN=$(TOOLS) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	@command -v protoc >/dev/null || { echo "make proto: protoc is required (apt-get install protobuf-compiler)"; exit 1; }
	PATH=$(TOOLS):$$PATH protoc --go_out=. --go_opt=paths=source_relative internal/onnx/onnxir.proto

fixtures:
	$(GO) run ./fixtures/gen -out fixtures

# fuzz runs every fuzz target for FUZZTIME each (go test fuzzes one target
# per invocation); `make test` runs their seed corpora as plain tests.
# Go 1.26's fuzz coordinator can fail a target with a bare "context deadline
# exceeded" when -fuzztime runs out while a worker is busy (go.dev/issue/75804,
# fixed in Go 1.27): CI met it on FuzzAssign with no failing input. So the
# fuzzing runs under FUZZ_TOOLCHAIN, which the go command takes from the Go
# module proxy (76 MB, once per machine); everything else stays on the
# machine's Go. FUZZ_TOOLCHAIN=local fuzzes with the machine's Go.
FUZZTIME ?= 60s
FUZZ_TOOLCHAIN ?= go1.27.3
FUZZ_TARGETS := ./internal/batch:FuzzDecodeNPY ./internal/batch:FuzzReadNPZ ./internal/observe:FuzzStatsObserve \
	./internal/onnx:FuzzLoadBytes ./internal/onnx:FuzzNewIndex ./internal/precision:FuzzAssign ./internal/rewrite:FuzzEmulate

fuzz: ort
	@v=$$(GOTOOLCHAIN=$(FUZZ_TOOLCHAIN) $(GO) env GOVERSION) || { \
	  echo "make fuzz: the go command could not fetch $(FUZZ_TOOLCHAIN) from the Go module proxy;"; \
	  echo "  fuzz with the machine's Go (which can fail a target at the -fuzztime deadline) by"; \
	  echo "  make fuzz FUZZ_TOOLCHAIN=local"; exit 1; }; \
	echo "fuzzing with $$v"; \
	export GOTOOLCHAIN=$(FUZZ_TOOLCHAIN); \
	for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; name=$${t##*:}; \
	  echo "fuzz $$pkg $$name for $(FUZZTIME)"; \
	  $(GO) test $$pkg -run '^$$' -fuzz "^$$name$$" -fuzztime $(FUZZTIME) || exit 1; \
	done

# conformance re-runs the sweep over the ONNX backend test models
# (apt-get install libonnx-testdata) and rewrites docs/conformance.md and
# internal/conformance/testdata/baseline.json. `make test` runs the same sweep and
# fails when an outcome gets worse than the baseline.
conformance: ort
	$(GO) test ./internal/conformance -run TestSweep -count=1 -update

vet:
	$(GO) vet ./...

clean:
	rm -rf bin dist $(PYVENV)
