package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/paydedup/paydedup/lab/localpg"
	"github.com/paydedup/paydedup/stream"
)

// natsCluster is the clustered NATS mode (-nats-cluster 3): nodes routed
// on loopback, each with its own store, the streams and consumers with one
// replica per node, the workers and the harness given every node's URL.
// The fault phase kills -9 one node at a time (the PAYMENTS leader every
// other time) and restarts it with its store.
type natsCluster struct {
	nodes  []*proc
	addrs  []string // client addresses, host:port
	names  []string // server names, as stream info names the leader
	rng    *rand.Rand
	kills  int
	leader int // kills that hit the PAYMENTS stream leader
}

// initNATSCluster starts n nodes and waits for each to listen; the
// JetStream meta leader is elected meanwhile (connectNATS waits for the
// streams).
func (h *harness) initNATSCluster(ctx context.Context, n int) error {
	c := &natsCluster{rng: rand.New(rand.NewPCG(h.cfg.seed, 0xc1a5))}
	routes := make([]string, n)
	clusterPorts := make([]int, n)
	for i := range n {
		cp, err := localpg.FreePort()
		if err != nil {
			return err
		}
		clusterPorts[i] = cp
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", cp)
	}
	for i := range n {
		port, err := localpg.FreePort()
		if err != nil {
			return err
		}
		store := filepath.Join(h.work, fmt.Sprintf("nats-%d", i))
		if err := os.Mkdir(store, 0o755); err != nil {
			return err
		}
		name := fmt.Sprintf("n%d", i)
		c.addrs = append(c.addrs, fmt.Sprintf("127.0.0.1:%d", port))
		c.names = append(c.names, name)
		c.nodes = append(c.nodes, h.procs.add(&proc{
			name: "nats-server-" + name, path: h.cfg.natsServer, env: []string{"PATH=/usr/bin:/bin"},
			log: filepath.Join(h.logs, "nats-server-"+name+".log"),
			args: []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", store, "-n", name,
				"--cluster_name", "paydedup-chaos", "--cluster", routes[i], "--routes", strings.Join(routes, ","),
				// Clients keep to the URLs they are given (so the network
				// fault mode's proxies are not bypassed by discovered ones).
				"--no_advertise"},
		}))
	}
	h.cluster = c
	for i := range n {
		if err := h.startNode(ctx, i); err != nil {
			return err
		}
	}
	h.logf("NATS: %d-node cluster on %s", n, strings.Join(c.addrs, ", "))
	return nil
}

func (h *harness) startNode(ctx context.Context, i int) error {
	c := h.cluster
	if err := c.nodes[i].start(); err != nil {
		return err
	}
	return waitFor(ctx, 30*time.Second, c.names[i]+" to listen", func() bool {
		select {
		case <-c.nodes[i].exited():
			return true // the supervisor or the next step reports it
		default:
		}
		return tcpUp(c.addrs[i])
	})
}

// natsURL is what workers, commands and the harness connect to: every
// node's URL in the clustered mode.
func (h *harness) natsURL() string {
	if h.cluster == nil {
		return "nats://" + h.natsAddr
	}
	urls := make([]string, len(h.cluster.addrs))
	for i, a := range h.cluster.addrs {
		urls[i] = "nats://" + a
	}
	return strings.Join(urls, ",")
}

// replicas of the streams and consumers: one per node.
func (h *harness) replicas() int {
	if h.cluster == nil {
		return 1
	}
	return len(h.cluster.nodes)
}

// restartNode kills -9 one node, every other time the PAYMENTS stream's
// leader, and starts it again with its store after a second; then it waits
// until the stream has a leader and every replica is current again, so the
// next kill never takes the quorum away.
func (h *harness) restartNode(ctx context.Context) error {
	c := h.cluster
	i, why := c.rng.IntN(len(c.nodes)), "a follower or any node"
	if c.kills%2 == 0 {
		if l := h.streamLeader(ctx); l >= 0 {
			i, why = l, "the PAYMENTS leader"
		}
	}
	wasLeader := i == h.streamLeader(ctx)
	h.logf("NATS: kill -9 %s (%s)", c.names[i], why)
	c.nodes[i].kill()
	c.kills++
	if wasLeader {
		c.leader++
	}
	time.Sleep(time.Second)
	if err := h.startNode(ctx, i); err != nil {
		return err
	}
	h.natsRestarts.Add(1)
	err := waitFor(ctx, 60*time.Second, "PAYMENTS to have a leader and current replicas", func() bool {
		return h.streamHealthy(ctx)
	})
	h.logf("NATS: %s restarted with its store; PAYMENTS leader now %s", c.names[i], c.nameOf(h.streamLeader(ctx)))
	return err
}

func (c *natsCluster) nameOf(i int) string {
	if i < 0 {
		return "(none)"
	}
	return c.names[i]
}

// streamLeader is the index of the PAYMENTS leader, -1 when unknown.
func (h *harness) streamLeader(ctx context.Context) int {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := h.js.Stream(ctx, stream.DefaultStream)
	if err != nil {
		return -1
	}
	info, err := s.Info(ctx)
	if err != nil || info.Cluster == nil {
		return -1
	}
	for i, n := range h.cluster.names {
		if n == info.Cluster.Leader {
			return i
		}
	}
	return -1
}

// streamHealthy: PAYMENTS and its dead-letter stream have a leader and all
// their followers are current.
func (h *harness) streamHealthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	for _, name := range []string{stream.DefaultStream, stream.DefaultDLQStream} {
		s, err := h.js.Stream(ctx, name)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != len(h.cluster.nodes)-1 {
			return false
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
	}
	return true
}

// clusterSummary is the cluster's part of the summary line.
func (h *harness) clusterSummary() string {
	if h.cluster == nil {
		return ""
	}
	return fmt.Sprintf(" nats_nodes=%d node_kills=%d leader_kills=%d", len(h.cluster.nodes), h.cluster.kills, h.cluster.leader)
}
