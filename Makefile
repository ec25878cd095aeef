# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
# The development tools (pytest, ruff, mypy, mkdocs, ...) go into the same venv, on top of what
# the package and its charts need: `make demo` installs only the latter.
DEV    := $(VENV)/.dev-tools-installed
OUT    := out
# The development broker's config, data and log (the docs' tests set their own).
KAFKA_DIR ?= .kafka/dev
# The brokers, cluster and registry of the tests and of these targets (harness/__main__.py).
HARNESS := $(BIN)/python -m harness

.PHONY: help demo dev wheel test test-unit test-lowest lint docs docs-serve check-docs docs-settings check check-deploy check-kubeconform check-helm prometheus-rule bench bench-quality bench-kafka chaos schemas broker-start broker-address broker-stop clean

$(BIN)/context-assembler: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[charts]'
	touch $@

$(DEV): $(BIN)/context-assembler
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

dev: $(DEV)  ## the development tools, for the tests, lint and the docs

help:  ## this list: each target and what it does
	@awk -F':.*## ' '/^[a-z][a-z-]*:.*## /{printf "  make %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# A wheel to install the package into another project (docs/library.md).
wheel: $(BIN)/context-assembler  ## dist/context_assembler-<version>-py3-none-any.whl
	rm -f dist/context_assembler-*.whl
	$(BIN)/pip wheel -q --no-deps -w dist .
	@ls dist/context_assembler-*.whl

demo: $(BIN)/context-assembler  ## assemble the shipped example events and show the decisions
	@mkdir -p $(OUT)
	$(BIN)/context-assembler assemble examples/events.jsonl --policy examples/policy.toml \
	    --out $(OUT)/prompts.jsonl --audit $(OUT)/audit.jsonl --errors $(OUT)/errors.jsonl
	$(BIN)/context-assembler explain --events examples/events.jsonl --policy examples/policy.toml
	$(BIN)/context-assembler sweep q30-staff --events examples/events.jsonl --policy examples/policy.toml \
	    --png $(OUT)/sweep-q30.png
	@echo "prompts: $(OUT)/prompts.jsonl  audit: $(OUT)/audit.jsonl  chart: $(OUT)/sweep-q30.png"

test: $(DEV)  ## every test; the Kafka tests start their own broker
	$(BIN)/python -m pytest

test-unit: $(DEV)  ## the tests that need no broker (about ten minutes on two cores)
	$(BIN)/python -m pytest -m 'not kafka' --ignore=tests/integration

# The unit tests at the lowest versions pyproject.toml allows, so its floors stay true. Left out:
# the schema-sync tests (schemas/ is generated with the pinned pydantic, whose JSON Schema output
# differs in form, not in meaning, between releases) and the tests that the pins are installed.
LOWEST := .venv-lowest
test-lowest: $(DEV)  ## unit tests at the lowest direct versions allowed
	$(BIN)/pip install -q -c constraints.txt uv
	$(BIN)/uv venv -q --allow-existing -p $(PYTHON) $(LOWEST)
	VIRTUAL_ENV=$(LOWEST) $(BIN)/uv pip install -q --resolution lowest-direct -e '.[dev]'
	$(LOWEST)/bin/python -m pytest -q -p no:cacheprovider -m 'not kafka' --ignore=tests/integration \
	    --deselect tests/contract/test_generate.py \
	    --deselect tests/contract/test_catalogue.py::test_each_record_has_its_schema_file \
	    --deselect tests/contract/test_catalogue.py::test_the_registry_registers_each_record_topics_schema_as_its_file_holds_it \
	    --deselect tests/deploy/test_image.py::test_every_runtime_dependency_is_pinned_in_constraints \
	    --deselect tests/deploy/test_image.py::test_the_msk_iam_extra_is_pinned_and_in_dev \
	    --deselect tests/kafka/test_batches.py::test_the_guard_names_the_aiokafka_it_was_read_against

lint: $(DEV)  ## ruff and mypy --strict
	$(BIN)/ruff check worker tests bench harness
	$(BIN)/mypy

check: lint test  ## lint, then every test

# Mermaid is served with the site (tools/mermaid/hook.py copies it in), never from a CDN: the
# version tools/mermaid/package-lock.json pins, installed by `npm ci` as the AsyncAPI parser is.
MERMAID := tools/mermaid
docs: $(DEV) $(MERMAID)/node_modules/.package-lock.json  ## the user documentation, built strictly into site/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

DOCS_ADDRESS ?= 127.0.0.1:8001
docs-serve: $(DEV) $(MERMAID)/node_modules/.package-lock.json  ## the site with search, on http://127.0.0.1:8001/ (DOCS_ADDRESS)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --strict --dev-addr $(DOCS_ADDRESS)

# Every page in headless Chromium (Debian's chromium package) at 1280 px: rendered with no
# request off this machine, diagrams drawn as SVG, no wide table or code block cut, search
# answering; one screenshot a page in out/check-docs/ to look at.
check-docs: docs  ## the built site in a real browser, offline
	$(BIN)/python -m tests.docs_browser site --screenshots $(OUT)/check-docs

$(MERMAID)/node_modules/.package-lock.json: $(MERMAID)/package.json $(MERMAID)/package-lock.json
	cd $(MERMAID) && npm ci --ignore-scripts --no-audit --no-fund --silent

# The operations artefacts, by their own ecosystems' tools: promtool (Debian's `prometheus`
# package) checks the alert rules and runs their unit tests; the AsyncAPI parser (pinned in
# tools/asyncapi/package-lock.json, installed by `npm ci`) validates schemas/asyncapi.yaml;
# kubeconform validates the Kubernetes manifests (check-kubeconform) and helm the chart (check-helm).
ASYNCAPI := tools/asyncapi
check-deploy: $(ASYNCAPI)/node_modules/.package-lock.json check-kubeconform check-helm  ## promtool, AsyncAPI, kubeconform, helm
	promtool check rules deploy/prometheus/alerts.yaml
	promtool test rules deploy/prometheus/alerts.test.yaml
	node $(ASYNCAPI)/validate.mjs schemas/asyncapi.yaml

$(ASYNCAPI)/node_modules/.package-lock.json: $(ASYNCAPI)/package.json $(ASYNCAPI)/package-lock.json
	cd $(ASYNCAPI) && npm ci --ignore-scripts --no-audit --no-fund --silent

# kubeconform -strict over every object deploy/k8s renders (each entry point, alone and with
# each component), CRDs included, against offline schemas (tests/deploy/kubeconform.py says
# which). Built at the pinned version from the Go module proxy into .tools/.
# `make check-kubeconform K8S_DIR=path` checks a copy of deploy/k8s instead.
KUBECONFORM_VERSION := v0.8.0
KUBECONFORM := .tools/kubeconform-$(KUBECONFORM_VERSION)/kubeconform
GO ?= $(firstword $(shell command -v go) /usr/local/go/bin/go)
K8S_DIR ?= deploy/k8s
check-kubeconform: $(KUBECONFORM) $(DEV)  ## kubeconform over the k8s manifests
	$(BIN)/python -m tests.deploy.kubeconform --kubeconform $(KUBECONFORM) $(K8S_DIR)

$(KUBECONFORM):
	GOBIN=$(abspath $(@D)) $(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)

# The Helm chart: `helm lint --strict` with each guarantee, then kubeconform over what `helm
# template` renders with each set of values in tests/deploy/helm.py, then the test comparing
# those renders with kustomize's, object by object. Helm is built at the pinned version from
# the Go module proxy into .tools/ (a few minutes and about 1.3 GB of memory the first time).
HELM_VERSION := v4.3.2
HELM := .tools/helm-$(HELM_VERSION)/helm
CHART := deploy/helm/context-assembler
check-helm: $(HELM) $(KUBECONFORM) $(DEV)  ## helm lint, kubeconform and kustomize's twin
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) --set guarantee=exactly_once --set monitoring.enabled=true
	$(BIN)/python -m tests.deploy.kubeconform --kubeconform $(KUBECONFORM) --helm $(HELM)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/deploy/test_helm.py

$(HELM):
	GOBIN=$(abspath $(@D)) $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION)

# The PrometheusRule carries alerts.yaml's groups as they stand: its own header (up to `spec:`),
# then alerts.yaml from `groups:` on, indented under `spec:`.
RULE := deploy/k8s/components/monitoring/prometheusrule.yaml
prometheus-rule: deploy/prometheus/alerts.yaml  ## rewrite the PrometheusRule (and the chart's copy) from alerts.yaml
	{ sed -n '1,/^spec:$$/p' $(RULE); sed -n '/^groups:/,$$p' $< | sed 's/^./  &/'; } > $(RULE).tmp
	mv $(RULE).tmp $(RULE)
	cp $< $(CHART)/files/alerts.yaml

schemas: $(BIN)/context-assembler  ## regenerate schemas/*.json and asyncapi.yaml from the models
	$(BIN)/python -m context_assembler.generate.schemas

docs-settings: $(BIN)/context-assembler  ## regenerate docs/settings.md from the settings model
	$(BIN)/python -m context_assembler.generate.settings_reference docs/settings.md

bench: $(DEV)  ## the engine against a naive greedy packer (the course lesson it follows); cost by chunk count
	$(BIN)/python -m bench.engine_bench
	$(BIN)/python -m bench.scaling

bench-quality: $(DEV)  ## answers kept at each budget on the shipped NQ-open sample
	$(BIN)/python -m bench.quality --strict

bench-kafka: $(DEV)  ## worker vs a passthrough worker on a real broker
	$(BIN)/python -m bench.kafka_bench --rate 150
	$(BIN)/python -m bench.kafka_bench --rate 150 --workload corpus --rss-events 0 --codec-rounds 0 \
		--json $(OUT)/kafka-bench-corpus.json

# `make chaos CHAOS=long`: >= 20,000 events and 20 faults per guarantee (about 20 minutes).
# Then exactly_once again with rounds of commits back to back (its default spaces them 50 ms):
# a few minutes more, about 12 in the long profile.
CHAOS ?= short
chaos: $(DEV)  ## faults on a 3-node cluster: out/chaos/report.json, timeline.png
	$(BIN)/python -m bench.chaos $(if $(filter long,$(CHAOS)),--long) --out $(OUT)/chaos
	$(BIN)/python -m bench.chaos $(if $(filter long,$(CHAOS)),--long) --guarantees exactly_once \
		--worker-env ASSEMBLER_COMMIT_INTERVAL_MS=0 --out $(OUT)/chaos-back-to-back

broker-start: $(BIN)/context-assembler  ## a local Kafka broker and the worker's topics; prints host:port
	@if $(HARNESS) broker address $(KAFKA_DIR) >/dev/null 2>&1; then \
	    echo "a broker is already running from $(KAFKA_DIR) (make broker-stop stops it)" >&2; \
	else $(HARNESS) broker start $(KAFKA_DIR) >/dev/null; fi
	@$(BIN)/context-assembler topics create --bootstrap-servers "$$($(HARNESS) broker address $(KAFKA_DIR))"
	@$(HARNESS) broker address $(KAFKA_DIR)

broker-address:  ## host:port of the broker broker-start started, while it runs
	@$(HARNESS) broker address $(KAFKA_DIR) 2>/dev/null || \
	    echo "no broker is running from $(KAFKA_DIR) (make broker-start starts one)" >&2

broker-stop:  ## stop the broker broker-start started
	$(HARNESS) broker stop $(KAFKA_DIR)

clean:  ## remove the venvs, outputs, built tools and caches
	rm -rf $(VENV) $(LOWEST) $(OUT) site dist build $(ASYNCAPI)/node_modules $(MERMAID)/node_modules .tools .kafka .pytest_cache .mypy_cache .ruff_cache
