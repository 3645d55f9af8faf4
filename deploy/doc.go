// Package deploy owns paydedup's deployment tree: the Dockerfile, the compose
// file for a laptop, the kustomize base, overlays and components, the Grafana
// dashboard and the Prometheus alerts. It has no code: its tests render every
// kustomize overlay offline, strict-decode each object into the Kubernetes API
// types, and check the tree against the binary it deploys (probe paths, the
// admin port, the drain deadline, the stream and consumer names, the
// environment variables it reads, the metrics it exports).
//
// It is its own module so that the Kubernetes libraries stay out of
// paydedup's. It does not import paydedup either: it reads the few facts it
// needs from the main module's source, so a dependency change there never
// makes this module's go.mod stale.
//
//	cd deploy && go test ./...
package deploy
