//go:build nolab

package main

// The production build (-tags nolab): no lab commands, no simulator, no
// workload generator. See lab.go.

import (
	"context"
	"errors"
	"time"

	"github.com/spf13/cobra"

	"github.com/paydedup/paydedup/provider/stripe"
	"github.com/paydedup/paydedup/stream"
)

const labBuild = false

func labCommands(*app) []*cobra.Command { return nil }

func simulated(context.Context, time.Duration) (*stripe.Client, func(), error) {
	return nil, nil, errors.New("PAYDEDUP_PROVIDER=sim: this build leaves the simulator out (-tags nolab)")
}

func (p *publishCmd) publishGenerated(context.Context, *stream.Publisher) error {
	return errors.New("publish: --generate: this build leaves the workload generator out (-tags nolab)")
}
