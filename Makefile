# paydedup. `make test` is the test command the README and CI use.
GO ?= go

.PHONY: test lint build bench deploy-test

test:
	$(GO) test -race -count=1 ./...

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/paydedup ./cmd/paydedup

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# The deploy tree, rendered and checked offline (its own module, so the
# Kubernetes libraries stay out of the main one).
deploy-test:
	cd deploy && $(GO) vet ./... && $(GO) test -count=1 ./...
