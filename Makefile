# paydedup. `make test` is the test command the README and CI use.
GO ?= go

.PHONY: test lint build bench

test:
	$(GO) test -race -count=1 ./...

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

build:
	CGO_ENABLED=0 $(GO) build -trimpath -o bin/paydedup ./cmd/paydedup

bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...
