# paydedup. `make test` is the test command the README and CI use.
GO ?= go

.PHONY: demo test lint build build-nolab bench deploy-test chaos chaos-short chaos-scale soak fuzz fuzz-short mutants console-screenshot bench-compare bench-growth bench-door bench-provider

# The README's demo: the whole system on this machine, with a proof at the
# end. go run prints nothing while it compiles, for minutes the first time:
# this says so first, then builds and runs the lab binary.
DEMOFLAGS ?=
demo:
	@echo "building paydedup (the first build takes a few minutes; later ones are cached)..."
	$(GO) build -o bin/paydedup ./cmd/paydedup
	bin/paydedup demo $(DEMOFLAGS)

# go test prints nothing of a passing package, not even a skip: what the
# tests run against, and what they leave out, is said here first.
test:
	@echo "make test: NATS: the server at $${TEST_NATS_URL:-nats://127.0.0.1:4222} if it answers with JetStream (TEST_NATS_URL names another), else an embedded one per test (under CI=true, a failure); the demo uses NATS_URL, else its own embedded server"
	@command -v spin >/dev/null && command -v gcc >/dev/null || \
		echo "make test: SKIPPED: the protocol model (lab/model, TestProtocolModel) needs spin and gcc (apt-get install -y spin gcc); under CI=true it fails instead"
	$(GO) test -race -count=1 ./...

# staticcheck (staticcheck.conf: its default checks and U1000, unused code)
# is a tool of the module (go.mod), fetched by go tool through the module
# proxy. It runs on the lab build with its tests, on the production build
# (-tags nolab) of the commands, and once more for unused code without the
# tests: shipped code that only tests call is reported too.
lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags nolab ./cmd/...
	$(GO) tool staticcheck ./...
	$(GO) tool staticcheck -tags nolab ./cmd/...
	$(GO) tool staticcheck -tests=false -checks U1000 ./...

# The lab build (demo, bench, provider-sim); the production image's binary
# is built with -tags nolab (deploy/Dockerfile), as build-nolab does.
build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/paydedup ./cmd/paydedup
build-nolab:
	CGO_ENABLED=0 $(GO) build -tags nolab -trimpath -o bin/paydedup ./cmd/paydedup

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The bench with the tables already full: one run per ROWS ledger rows
# preloaded (keys over the last 48 h, capped at 10M), payments/s and CPU per
# payment against the rows present, plotted to docs/perf/growth.png and
# tabled in docs/perf/growth.md (docs/performance.md, "As the tables grow").
# Each run times 60,000 payments after a warm-up of 60,000 of their own.
ROWS ?= 0,1000000,3000000,10000000
bench-growth:
	$(GO) run ./cmd/paydedup bench growth --rows $(ROWS) --payments 60000 --warmup 60000

# The worker's rate beside River's, on the same PostgreSQL in the same run:
# paydedup bench and bin/river bench, N each, A B A B, best of two, the
# ratio in the last line's JSON (docs/performance.md). bin/river is our own
# program in lab/benchcompare/river: it measures River (the
# library, pinned in its go.mod) by the method of River's own "river bench",
# whose CLI the module proxy here does not serve.
N ?= 60000
RIVER_SRC = lab/benchcompare/river
bin/river: $(RIVER_SRC)/go.mod $(RIVER_SRC)/go.sum $(wildcard $(RIVER_SRC)/*.go)
	cd $(RIVER_SRC) && GOBIN=$(CURDIR)/bin $(GO) install .
bench-compare: bin/river
	$(GO) run ./cmd/paydedup bench compare --payments $(N) --river $(CURDIR)/bin/river --json

# The gateway as shipped under wrk (Debian's, installed when missing), then
# the worker draining what it accepted, then POST to charged with both on
# (docs/performance.md, "The door as shipped").
bench-door:
	command -v wrk || (apt-get update && apt-get install -y wrk)
	$(GO) run ./cmd/paydedup bench door --json

# The shipped worker against the provider as it really is (docs/performance.md,
# "Against a provider as it really is"): one worker at its defaults against a
# 300 ms provider, two workers under Stripe's live-mode 100/s, and merchant B's
# 100 payments behind merchant A's backlog under 1,000/s. PROVIDER_PAYMENTS
# and PROVIDER_BACKLOG scale them.
PROVIDER_PAYMENTS ?= 3000
PROVIDER_BACKLOG ?= 20000
bench-provider:
	$(GO) build -o bin/paydedup ./cmd/paydedup
	bin/paydedup bench provider --payments $(PROVIDER_PAYMENTS) --json
	bin/paydedup bench provider --payments $(PROVIDER_PAYMENTS) --workers 2 --rate-limit 100 --json
	bin/paydedup bench provider --rate-limit 1000 --merchant-a-backlog $(PROVIDER_BACKLOG) --merchant-b-payments 100 --merchant-b-after 2s --json

# The README's screenshot of the console, taken by its browser test.
console-screenshot:
	PAYDEDUP_CONSOLE_SCREENSHOT=$(CURDIR)/docs/console.png $(GO) test -count=1 -run '^TestBrowser' ./console

# Mutants (lab/cmd/mutant/mutants.txt): each small slip in the money path,
# applied alone to a scratch copy of the tree, must fail the tests named for
# it. Never edits the working tree.
MUTANTFLAGS ?=
mutants:
	$(GO) run ./lab/cmd/mutant $(MUTANTFLAGS)

# The deploy tree, rendered and checked offline (its own module, so the
# Kubernetes libraries stay out of the main one).
deploy-test:
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...

# The chaos harness: the real binary as separate processes, with worker
# kills, NATS kill -9 restarts and Postgres immediate stops (see README);
# HTTP clients keep the client contract through a gateway whose PubAcks are
# lost at times, the provider and Postgres go away for longer than the
# delivery schedule and a lease: every promise a client was given is
# checked at the end. No dead letter is replayed (-replay none): a good
# payment a fault dead-lettered shows as a lost one (see README).
# make chaos adds a three-node NATS cluster (single nodes killed, the stream
# leader among them), worker pauses past the lease and network faults
# (latency, cut connections, partitions) on every worker link, and the
# provider as it really is: 50 ms median, 200 ms p99, the account limited to
# 200 requests/s (the run ends with the 429s and pauses it caused).
chaos:
	$(GO) run ./lab/cmd/chaos -payments 20000 -nats-cluster 3 -nats-restarts 4 -pauses 3 -net-latency -net-cuts -net-partitions -pg-failover 2 -gateway-clients 16 -gateway-payments 5000 -puback-losses 4 -gateway-kills 2 -provider-outage 30s -replay none -provider-rate-limit 200 -provider-latency-median 50ms -provider-latency-p99 200ms
# make chaos-short runs twice: once against the fast simulator, once
# against a slow one limiting the account to 100 requests/s and 25 in
# flight (Stripe live mode's rate), the same faults (about 2 minutes more).
chaos-short:
	$(GO) run ./lab/cmd/chaos -payments 2000 -gateway-clients 8 -gateway-payments 500 -puback-losses 3 -gateway-kills 2 -provider-outage 30s -pg-long-stop 8s -replay none
	$(GO) run ./lab/cmd/chaos -payments 2000 -gateway-clients 8 -gateway-payments 500 -puback-losses 3 -gateway-kills 2 -provider-outage 30s -pg-long-stop 8s -replay none -provider-rate-limit 100 -provider-concurrency-limit 25 -provider-latency-median 50ms -provider-latency-p99 200ms
# Throughput and p99 of 1, 2, 4 and 8 worker processes on one consumer.
chaos-scale:
	$(GO) run ./lab/cmd/chaos -scale 1,2,4,8
# A steady load with periodic faults; the last line says whether memory,
# goroutines, descriptors, connections and pending rows stayed flat.
SOAK ?= 30m
soak:
	$(GO) run ./lab/cmd/chaos -soak $(SOAK)

# Fuzz targets. Budgets are execution counts, not durations: with a
# duration, Go 1.26's fuzz coordinator can report a spurious "context
# deadline exceeded" failure at the deadline (golang/go#75804, fixed in
# 1.27). -fuzzminimizetime bounds minimisation, which can otherwise stall a
# short run on a busy machine.
FUZZTIME ?= 20000x
FUZZFLAGS = -run='^$$' -fuzztime=$(FUZZTIME) -fuzzminimizetime=100x
fuzz-short:
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzDecode$$' ./payment
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzDecodeMetadata$$' ./payment
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzDecodeMatchesReference$$' ./payment
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzFingerprint$$' ./ledger
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzFingerprintReencode$$' ./ledger
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzParseDeadLetter$$' ./stream
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzLetterRoundTrip$$' ./stream
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzRedactPANs$$' ./internal/redact
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzOutputsHoldNoCardNumber$$' ./cmd/paydedup
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzLetterPageHoldsNoCardNumber$$' ./console
	$(GO) test $(FUZZFLAGS) -fuzz='^FuzzChargeFormIsStripeGos$$' ./provider/stripe
fuzz:
	$(MAKE) fuzz-short FUZZTIME=1100000x
