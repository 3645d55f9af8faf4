// Command paydedup makes at-least-once payment commands exactly-once in
// effect. See README.md.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRootCmd(os.Stdout, os.Stderr, os.Getenv).ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "paydedup:", err)
		stop()
		os.Exit(1)
	}
}
