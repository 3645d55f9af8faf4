//go:build !nolab

package main

// The lab build (the default): the commands that run paydedup on one
// machine — demo, bench and provider-sim — the in-process simulator behind
// PAYDEDUP_PROVIDER=sim, and publish --generate. The production image is
// built with -tags nolab (nolab.go), which links none of them: not the
// simulator, not the embedded nats-server, not the workload generator.

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/lab/inproc"
	"github.com/paydedup/paydedup/lab/stripesim"
	"github.com/paydedup/paydedup/lab/workload"
	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

// localPostgresEnv names the local server demo and bench try first when
// DATABASE_URL is unset (default localpg.AdminURL); pointed at a closed
// port, they go on to a private cluster.
const localPostgresEnv = "PAYDEDUP_LOCAL_POSTGRES_URL"

// labBuild reports whether the lab is linked.
const labBuild = true

// labCommands are the lab's commands.
func labCommands(a *app) []*cobra.Command {
	return []*cobra.Command{newProviderSimCmd(a), newDemoCmd(a), newBenchCmd(a)}
}

// simulated is PAYDEDUP_PROVIDER=sim: the Stripe adapter pointed at a
// simulator served in-process on a loopback port.
func simulated(ctx context.Context, timeout time.Duration) (*stripe.Client, func(), error) {
	prov, _, stop, err := inproc.Simulator(ctx, stripesim.Config{}, timeout)
	return prov, stop, err
}

// publishGenerated publishes N generated payments and the duplicates, each
// duplicate a few messages after its original.
func (p *publishCmd) publishGenerated(ctx context.Context, pub *stream.Publisher) error {
	seed := p.seed
	if seed == 0 {
		seed = rand.Uint64()
	}
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	merchants := []string{"m_acme", "m_globex", "m_initech"}
	if p.merchant != "" {
		merchants = []string{p.merchant}
	}
	cmds := make([]workload.Command, p.generate)
	for i := range cmds {
		// The letter before the seed keeps its hex digits an identifier, so
		// no key holds a card-number-shaped group of digits (redact.PANs).
		cmds[i] = workload.NewCommand(rng, fmt.Sprintf("gen-s%016x-%07d", seed, i), merchants[rng.IntN(len(merchants))], rng.Float64() < p.declines)
	}
	order := workload.WithDuplicates(rng, p.generate, p.duplicates)
	p.bar.ChangeMax(len(order))
	for _, i := range order {
		if err := pub.Publish(ctx, stream.CommandMsg(p.streams.cfg, cmds[i].Cmd.MerchantID, cmds[i].Cmd.IdempotencyKey, cmds[i].Body)); err != nil {
			return err
		}
	}
	return nil
}

// labDLQKey is the DLQ key of the demo's and the bench's in-process
// workers: PAYDEDUP_DLQ_KEY when set (it must then be valid), else a random
// key for this run only.
func (a *app) labDLQKey() ([]byte, error) {
	if a.getenv(dlqKeyEnv) != "" {
		return a.dlqKey()
	}
	b := make([]byte, stream.MinDLQKeyLen)
	if _, err := crand.Read(b); err != nil {
		return nil, fmt.Errorf("generate a DLQ key: %w", err)
	}
	return []byte(hex.EncodeToString(b)), nil
}
