# playpipe — the targets people expect. `make test` is what CI runs (.ci/run).
GO        ?= go
PKGS      ?= ./...
STATICCHECK_VERSION ?= v0.8.2
DEADCODE_VERSION    ?= v0.52.0
BIN       := bin/playpipe
export PATH := $(PATH):$(shell $(GO) env GOPATH)/bin:/usr/sbin

# Nested modules. The deploy checks (k8s.io/api, kustomize, compose-go), the
# image's health check (the standard library only) and the Docker suite
# (testcontainers-go, the Docker client; e2e/docker, `make e2e-docker`) have
# go.mod files of their own, so that a program importing playpipe's libraries
# resolves none of their dependencies (producer's TestFleetModuleGraph). `./...`
# stops at a nested go.mod, so the targets below also run their command in each
# of SUBMODULES — when PKGS is the default ./..., not for a chosen package list.
SUBMODULES := deploy deploy/healthcheck
in-submodules = set -e; for m in $(if $(filter ./...,$(PKGS)),$(SUBMODULES)); do echo "== module $$m"; (cd $$m && $(1)); done

.PHONY: chaos chaos-short kafka all build demo test test-race test-chdb test-short unit lint fmt-check vet staticcheck deadcode bench bench-e2e bench-report bench-report-bound bench-report-latency bench-report-errors bench-audit bench-audit-chdb fuzz fuzz-short tools clickhouse zookeeper chromium chdb nginx nft promtool clean e2e-docker

all: build

build:
	$(GO) build -o $(BIN) ./cmd/playpipe

## demo: install what is missing, build, and run the whole pipeline on embedded defaults.
demo: clickhouse build
	./$(BIN) demo

## test: everything CI checks: formatting, vet, staticcheck, a short run of every fuzz target, then all tests with the race detector, then the ledger suite on current ClickHouse (test-chdb).
test: tools clickhouse zookeeper chromium chdb nginx nft promtool kafka lint fuzz-short test-race test-chdb chaos-short

# `make test` installs ClickHouse, ZooKeeper, Chromium, nginx, nftables and
# iproute2 and Apache Kafka's jars first, so a missing server, browser, edge or
# broker is a failure, not a skip
# (PLAYPIPE_REQUIRE_CLICKHOUSE covers ZooKeeper too: the replicated-ledger
# tests need both).
TEST_ENV = PLAYPIPE_KAFKA_VERSION=$(KAFKA_VERSION) PLAYPIPE_REQUIRE_KAFKA=$${PLAYPIPE_REQUIRE_KAFKA:-1} PLAYPIPE_REQUIRE_CLICKHOUSE=$${PLAYPIPE_REQUIRE_CLICKHOUSE:-1} PLAYPIPE_REQUIRE_CHROMIUM=$${PLAYPIPE_REQUIRE_CHROMIUM:-1} PLAYPIPE_REQUIRE_NGINX=$${PLAYPIPE_REQUIRE_NGINX:-1} PLAYPIPE_REQUIRE_PROMTOOL=$${PLAYPIPE_REQUIRE_PROMTOOL:-1}
test-race:
	$(TEST_ENV) $(GO) test -race -count=1 -timeout 45m $(PKGS)
	@$(call in-submodules,$(TEST_ENV) $(GO) test -race -count=1 -timeout 20m ./...)

## test-chdb: the ledger tests that run on every ClickHouse (testenv.ForEachLedger:
## migrations, the sink's rows, every audit number, list and HTML query, the
## dashboard panels, replay selection), on current ClickHouse in-process through
## chdb (build tag chdb; CHDB_LIB_PATH names libchdb.so, installed by `make chdb`).
## Their clickhouse-server (18.16) runs are part of test-race; here only the chdb
## subtests run (the deploy module's dashboard panels too). With the race detector:
## chdbconn calls the library through purego, whose calls the detector does not
## instrument, as it does not cgo's.
CHDB_PKGS  := ./analytics ./testkit/chdbconn ./replay
CHDB_TESTS := TestLedgerSuite|TestTwoTopicGenerations|TestDashboardQueries|TestSelectReportsOnEveryLedger|TestDriverBehavesAlike
test-chdb: chdb
	@rc=0; CHDB_LIB_PATH=$(abspath $(CHDB_LIB)) PLAYPIPE_REQUIRE_CLICKHOUSE=$${PLAYPIPE_REQUIRE_CLICKHOUSE:-1} \
	  $(GO) test -race -tags chdb -count=1 -timeout 10m -run '^($(CHDB_TESTS))$$/^chdb$$' -v $(CHDB_PKGS) > $(CHDB_DIR)/test.log 2>&1 || rc=$$?; \
	[ $$rc != 0 ] || (cd deploy && CHDB_LIB_PATH=$(abspath $(CHDB_LIB)) PLAYPIPE_REQUIRE_CLICKHOUSE=$${PLAYPIPE_REQUIRE_CLICKHOUSE:-1} \
	  $(GO) test -race -tags chdb -count=1 -timeout 10m -run '^($(CHDB_TESTS))$$/^chdb$$' -v ./...) >> $(CHDB_DIR)/test.log 2>&1 || rc=$$?; \
	if [ $$rc = 0 ]; then grep -E '^(--- |ok )|ledger on ClickHouse' $(CHDB_DIR)/test.log; else cat $(CHDB_DIR)/test.log; fi; exit $$rc

## unit: the tests without the race detector (faster, for the edit loop).
unit:
	$(GO) test -count=1 $(PKGS)
	@$(call in-submodules,$(GO) test -count=1 ./...)

## test-short: the unit tier, for the edit loop: every package with -short, so the
## end-to-end suites (e2e/, the processes of cmd/playpipe, the Kafka cluster) and the
## other slow tests skip (testing.Short guards); no race detector, no fuzzing, no lint.
## Tests that need a local part still start it where it is installed (clickhouse-server,
## one Apache Kafka node per test binary, Chromium) and skip where it is not.
## On the 2-core machine with a warm build cache: 2 min 41 s idle, 3 min at load average 21,
## 7 min at 32–40 (reporter 113 s, analytics 88 s, cmd/playpipe 63 s, consumer 62 s).
test-short:
	$(GO) test -short -count=1 -timeout 10m $(PKGS)
	@$(call in-submodules,$(GO) test -short -count=1 ./...)

lint: fmt-check vet staticcheck deadcode

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi

# The docker-tagged suite (e2e/docker, a module of its own) is vetted and
# statically checked too, so it compiles in CI even where no Docker engine can
# run it.
vet:
	$(GO) vet $(PKGS)
	$(GO) vet -tags chdb $(PKGS)
	$(GO) vet -tags benchstub ./reporter/ ./cmd/...
	@$(call in-submodules,$(GO) vet ./... && $(GO) vet -tags chdb ./...)
	cd e2e/docker && $(GO) vet -tags docker ./...

staticcheck:
	staticcheck $(PKGS)
	staticcheck -tags chdb $(PKGS)
	staticcheck -tags benchstub ./reporter/
	@$(call in-submodules,staticcheck ./... && staticcheck -tags chdb ./...)
	cd e2e/docker && staticcheck -tags docker ./...

## e2e-docker: the end-to-end suite on Apache Kafka and current ClickHouse
## containers (the images docker-compose.yml uses), roles as processes.
## Needs a Docker engine; not part of `make test`.
e2e-docker:
	cd e2e/docker && $(GO) test -tags docker -count=1 -timeout 20m -v ./...

## chaos: the whole pipeline as processes on a three-node Apache Kafka cluster
## (node 3 in a network namespace when run as root), ClickHouse, the sandbox
## behind nginx, consume ×2, report ×2, sink and the gateway under a supervisor,
## a fleet publishing at CHAOS_RATE events/s, through CHAOS_MINUTES (10) of
## seeded random overlapping faults (CHAOS_SEED; CHAOS_EXCLUDE=hang,… leaves
## kinds out); then a verdict play by play, exit 1 on a violation. docs/chaos.md.
CHAOS_MINUTES ?= 10
CHAOS_SEED    ?= 1
CHAOS_EXCLUDE ?=
CHAOS_FLAGS   ?=
chaos: clickhouse nginx nft kafka build
	CHAOS_MINUTES=$(CHAOS_MINUTES) CHAOS_SEED=$(CHAOS_SEED) CHAOS_EXCLUDE=$(CHAOS_EXCLUDE) $(GO) run ./tools/chaos -bin $(BIN) $(CHAOS_FLAGS)

## chaos-short: a fixed-seed chaos run of 3 minutes of faults (hang excluded
## until the reporter survives it), for CI.
CHAOS_SHORT_EXCLUDE ?=
chaos-short: clickhouse nginx nft kafka build
	CHAOS_MINUTES=3 CHAOS_SEED=7 CHAOS_EXCLUDE=$(CHAOS_SHORT_EXCLUDE) $(GO) run ./tools/chaos -bin $(BIN) -mean-gap 6s $(CHAOS_FLAGS)

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 $(PKGS)

## bench-e2e: the whole pipeline as users run it, every role a process of the
## built binary (broker, sandbox --lean, ClickHouse, consume, report, sink,
## simulate): plays/s end to end, CPU µs per play and peak RSS per process,
## and the raw HTTP ceiling of the same run. BENCH_E2E_FLAGS="-events 80000 -keep".
## Every bench mode takes -kafka apache: one Apache Kafka node (KRaft, a JVM from
## `make kafka`'s jars) instead of the embedded kfake, its CPU and peak RSS the
## broker's: BENCH_E2E_FLAGS="-kafka apache", BENCH_REPORT_FLAGS="-kafka apache".
## Default: -kafka both (kfake, then Apache Kafka and Kafka's own
## ProducerPerformance and ConsumerPerformance on its node: the floor).
BENCH_E2E_FLAGS ?=
bench-e2e: clickhouse build kafka
	$(GO) run ./tools/bench -bin $(BIN) -kafka both $(BENCH_E2E_FLAGS)

## bench-audit: `playpipe audit` on synthetic ledgers generated on a local
## clickhouse-server (INSERT … SELECT from numbers(): doubles, doubts, replays,
## rejections, parked and pending plays in known numbers): the audit and
## --list delivered-twice of the whole window and of its last day, seconds per
## million plays, the server's peak resident memory, and every figure checked
## against the seeded truth; the exact path (--exact) too up to -exact-up-to.
## The server's data lie under $PLAYPIPE_CLICKHOUSE_TMP or the temporary folder
## (on disk: 50 M plays are about 12 GB); 50 M take about 10 minutes to generate
## on 2 cores. BENCH_AUDIT_SIZES="5000000" BENCH_AUDIT_FLAGS="-days 30 -v -keep".
BENCH_AUDIT_SIZES ?= 5000000,20000000,50000000
BENCH_AUDIT_FLAGS ?=
bench-audit: clickhouse
	$(GO) run ./tools/benchaudit -sizes $(BENCH_AUDIT_SIZES) $(BENCH_AUDIT_FLAGS)

## bench-audit-chdb: the same ledgers and checks on current ClickHouse, in
## process through chDB (`make chdb`'s library): in memory, one query at a
## time, no memory limit, so 5 M and 20 M plays by default.
BENCH_AUDIT_CHDB_SIZES ?= 5000000,20000000
bench-audit-chdb: chdb
	CHDB_LIB_PATH=$(abspath $(CHDB_LIB)) $(GO) run -tags chdb ./tools/benchaudit -chdb -sizes $(BENCH_AUDIT_CHDB_SIZES) $(BENCH_AUDIT_FLAGS)

## bench-report: the reporter alone as a process (`playpipe report`, consuming,
## posting, producing Delivery records, committing) against a plain net/http
## client posting the same bodies with the same number in flight to the same
## `sandbox --lean` process; interleaved rounds, medians of the rate and the
## CPU-per-report ratios. BENCH_REPORT_FLAGS="-reports 200000 -rounds 5 -profile report.pprof".
BENCH_REPORT_FLAGS ?=
bench-report: build
	$(GO) run ./tools/bench -bin $(BIN) -mode report $(BENCH_REPORT_FLAGS)

## bench-report-bound: the same bench with a measurement build of the reporter
## that writes no Delivery record and no lease marker (`-tags benchstub`, each
## "acknowledged" at once): the most that cutting the reporter's Kafka writes
## could give at 0 ms. Never deploy that build. docs/reporter.md, "The 0 ms bound".
bench-report-bound: build
	$(GO) build -tags benchstub -o bin/playpipe-benchstub ./cmd/playpipe
	$(GO) run ./tools/bench -bin bin/playpipe-benchstub -mode report $(BENCH_REPORT_FLAGS)

## bench-report-latency: the same reporter process with DEFAULT flags (the
## adaptive in-flight limit finds the partner) against the plain client, the
## sandbox answering after 0, 5, 50 and 150 ms; plays/s, in flight reached,
## time to steady rate, CPU per report. BENCH_LATENCY_FLAGS="-reports 150000".
## Its error-rate dimension, -error-rates (default 0: no errors, the rounds
## above), runs every latency once per rate with that share of posts answered
## 500 (seeded sandbox faults: the plain client and the reporter meet the same
## sequence), the plain client retrying a 500 with the reporter's default
## backoff at the same in flight; the table gains the rate and the 500s
## retried. The rates are not in the default set: at 1 % the reporter fell to
## ~360 reports/s (20 000 reports, 50 ms, 2026-11-27), so a 150 000-report
## round would take ~7 min each; bench-report-errors runs them on fewer reports.
BENCH_LATENCY_FLAGS ?= -reports 150000
bench-report-latency: build
	$(GO) run ./tools/bench -bin $(BIN) -mode latency $(BENCH_LATENCY_FLAGS)

## bench-report-errors: bench-report-latency's error rounds: 50 and 150 ms
## partner latency with 0, 0.1, 1 and 2 % of posts answered 500, reporter
## (DEFAULT flags) vs the plain client retrying the same way; 8 rounds of
## BENCH_ERRORS_FLAGS="-reports 30000 -timeout 10m" (about 15 min on 2 cores
## while the reporter's limit collapses under errors: 20 000 reports at 50 ms,
## 0 and 1 % took 2.5 min; a few minutes once it holds its in flight).
## Each latency also runs a poison-track round (-poison-share 0.03: 3 % of the
## reports are of one track answered 500 every time) and a hang round
## (-hang-share 0.025: 2.5 % of one track held 35 s, past the default 30 s
## --api-timeout, then answered 500): the other reports' rate against the
## round with no fault, in a table of its own; and a random-hold round
## (-hold-rate 0.01: 1 % of all posts, any track, held 35 s): every report
## delivered once, the reporter against the plain client with the reporter's
## in-flight cap (1 024), --api-timeout and retries.
BENCH_ERRORS_FLAGS ?= -reports 30000 -timeout 10m
bench-report-errors: build
	$(GO) run ./tools/bench -bin $(BIN) -mode latency -latencies 50ms,150ms -plain-inflight 512,1024 -error-rates 0,0.001,0.01,0.02 -poison-share 0.03 -hang-share 0.025 -hold-rate 0.01 $(BENCH_ERRORS_FLAGS)

## fuzz: each fuzz target for FUZZTIME (untrusted input: events, API answers, report bodies, records).
## fuzz-short: the same targets for 30 000 inputs each, run by `make test`. A count,
## not a duration: go1.26's fuzz coordinator can fail a target with "context
## deadline exceeded" when a -fuzztime duration ends (golang/go#75804, fixed in
## go1.27); a count never arms that deadline.
FUZZTIME ?= 20s
FUZZ_TARGETS := \
	FuzzParseEvent:./schemas/ \
	FuzzParseEventFastVsSlow:./schemas/ \
	FuzzDecodeRecords:./schemas/ \
	FuzzAppendReportJSON:./schemas/ \
	FuzzAppendDelivery:./schemas/ \
	FuzzAppendJSONString:./schemas/ \
	FuzzDecoders:./partnerapi/ \
	FuzzClassifyAnswer:./partnerapi/ \
	FuzzReportValidation:./partnerapi/sandbox/ \
	FuzzSplitBatch:./producer/gateway/
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "$(GO) test -run '^$$' -fuzz '^$${t%%:*}$$' -fuzztime $(FUZZTIME) $${t#*:}"; \
	  $(GO) test -run '^$$' -fuzz "^$${t%%:*}\$$" -fuzztime $(FUZZTIME) $${t#*:}; \
	done

fuzz-short:
	@$(MAKE) --no-print-directory fuzz FUZZTIME=30000x

## tools: Go tools the checks use.
tools:
	@command -v staticcheck >/dev/null 2>&1 || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	@command -v deadcode >/dev/null 2>&1 || $(GO) install golang.org/x/tools/cmd/deadcode@$(DEADCODE_VERSION)

## deadcode: no function unreachable from main or the tests.
deadcode:
	@out=$$(deadcode -test $(PKGS)); if [ -n "$$out" ]; then echo "deadcode -test finds unreachable functions:"; echo "$$out"; exit 1; fi
	@$(call in-submodules,out=$$(deadcode -test ./...); if [ -n "$$out" ]; then echo "deadcode -test finds unreachable functions:"; echo "$$out"; exit 1; fi)

## kafka: Apache Kafka's own jars for the tests (org.apache.kafka:kafka_2.13
## KAFKA_VERSION with its runtime dependencies and a log binding), resolved
## with Maven from deploy/kafka/pom.xml into .playpipe/kafka/<version>/libs;
## Java 17 and Maven from the distribution when missing. The tests start KRaft
## nodes from them (testkit/kafkanode). KAFKA_VERSION=3.9.2 selects the last
## 3.x release (docs/kafka.md, "Apache Kafka in the tests"). Kafka's own
## performance tools (kafka-tools, for bench-e2e's floor) go beside them into
## .playpipe/kafka/<version>/tools, from deploy/kafka/tools-pom.xml.
KAFKA_VERSION ?= 4.1.0
KAFKA_LIBS    := .playpipe/kafka/$(KAFKA_VERSION)/libs
KAFKA_TOOLS   := .playpipe/kafka/$(KAFKA_VERSION)/tools
kafka:
	@if [ -f $(KAFKA_LIBS)/kafka_2.13-$(KAFKA_VERSION).jar ]; then :; else \
	  if ! command -v mvn >/dev/null 2>&1 || ! command -v java >/dev/null 2>&1; then \
	    SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	    $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y openjdk-17-jre-headless maven; \
	  fi; \
	  rm -rf $(KAFKA_LIBS).tmp; \
	  mvn -q -B -f deploy/kafka/pom.xml -Dkafka.version=$(KAFKA_VERSION) $(if $(filter 3.%,$(KAFKA_VERSION)),-Dkafka3) \
	    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(KAFKA_LIBS)).tmp && \
	  mv $(KAFKA_LIBS).tmp $(KAFKA_LIBS) && echo "Apache Kafka $(KAFKA_VERSION): $$(ls $(KAFKA_LIBS) | wc -l) jars in $(KAFKA_LIBS)"; \
	fi
	@if [ -f $(KAFKA_TOOLS)/kafka-tools-$(KAFKA_VERSION).jar ]; then :; else \
	  rm -rf $(KAFKA_TOOLS).tmp; \
	  mvn -q -B -f deploy/kafka/tools-pom.xml -Dkafka.version=$(KAFKA_VERSION) \
	    dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(abspath $(KAFKA_TOOLS)).tmp && \
	  mv $(KAFKA_TOOLS).tmp $(KAFKA_TOOLS) && echo "Apache Kafka $(KAFKA_VERSION) tools: $$(ls $(KAFKA_TOOLS) | wc -l) jars in $(KAFKA_TOOLS)"; \
	fi

## clickhouse: the tests and the demo start a local clickhouse-server; install it from the distribution when missing.
clickhouse:
	@if command -v clickhouse-server >/dev/null 2>&1 || command -v clickhouse >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y clickhouse-server; \
	else echo "clickhouse-server not found: install ClickHouse (https://clickhouse.com/docs/install) or set PLAYPIPE_CLICKHOUSE_ADDR"; exit 1; fi

## chdb: current ClickHouse as a library for test-chdb: npm's @chdb/lib-linux-x64-gnu
## ships libchdb.so (~570 MB), installed once into CHDB_DIR (git-ignored) and
## reinstalled only when it is missing or CHDB_VERSION changes; npm from the
## distribution when missing.
CHDB_VERSION ?= 26.7.3-stable.1
CHDB_DIR     ?= .playpipe/chdb
CHDB_LIB     := $(CHDB_DIR)/node_modules/@chdb/lib-linux-x64-gnu/libchdb.so
chdb:
	@if [ -f $(CHDB_LIB) ] && grep -q '"version": "$(CHDB_VERSION)"' $(CHDB_DIR)/node_modules/@chdb/lib-linux-x64-gnu/package.json 2>/dev/null; then :; else \
	  if ! command -v npm >/dev/null 2>&1; then \
	    if command -v apt-get >/dev/null 2>&1; then \
	      SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	      $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y npm; \
	    else echo "npm not found: install Node.js/npm (make chdb installs @chdb/lib-linux-x64-gnu with it)"; exit 1; fi; \
	  fi; \
	  mkdir -p $(CHDB_DIR) && npm install --prefix $(CHDB_DIR) --no-save --no-audit --no-fund @chdb/lib-linux-x64-gnu@$(CHDB_VERSION) && test -f $(CHDB_LIB); \
	fi

## zookeeper: the replicated-ledger tests (testkit/chcluster) run Debian's ZooKeeper
## (its Java main, in a temporary folder; never the system service); install it when missing.
zookeeper:
	@if [ -f /usr/share/java/zookeeper.jar ] && command -v java >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y zookeeper; \
	else echo "ZooKeeper not found (/usr/share/java/zookeeper.jar and java): install Debian's zookeeper package, or run the tests with PLAYPIPE_REQUIRE_CLICKHOUSE=0 (the replicated-ledger tests then skip)"; exit 1; fi

## chromium: the HTML audit report's test renders the page in headless Chromium; install it from the distribution when missing.
chromium:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || command -v google-chrome >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y chromium; \
	else echo "chromium not found: install Chromium, or run the tests with PLAYPIPE_REQUIRE_CHROMIUM=0 (the HTML report test then skips)"; exit 1; fi

## nginx: the edge suite (e2e/edge) runs Debian's nginx as the partner's edge, as a process of its own; install it from the distribution when missing.
nginx:
	@if command -v nginx >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y nginx; \
	else echo "nginx not found: install nginx, or run the tests with PLAYPIPE_REQUIRE_NGINX=0 (the edge suite then skips)"; exit 1; fi

## nft: the network partition of the Apache Kafka cluster test (e2e TestKafkaClusterFaults)
## puts a broker in a network namespace of its own and drops its packets with nftables:
## nft and ip, from nftables and iproute2, installed when missing (the test itself needs
## root to make the namespace, and says so when it skips that fault).
nft:
	@if command -v nft >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y nftables iproute2; \
	else echo "nft or ip not found: install nftables and iproute2 (the Kafka cluster test's network partition needs them)"; exit 1; fi

## promtool: the alert rules (deploy/prometheus/alerts.yaml) are evaluated by
## `promtool test rules` on a reporter's real /metrics output (e2e's alert
## test); Debian's prometheus package ships it; installed when missing.
promtool:
	@if command -v promtool >/dev/null 2>&1; then :; \
	elif command -v apt-get >/dev/null 2>&1; then \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y prometheus; \
	else echo "promtool not found: install Prometheus' promtool, or run the tests with PLAYPIPE_REQUIRE_PROMTOOL=0 (the alert-rule evaluation then skips)"; exit 1; fi

clean:
	rm -rf bin
