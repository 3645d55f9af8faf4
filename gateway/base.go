package gateway

import "log/slog"

// base is what the batched intake and the handlers share: the settings,
// the stores, the publisher, the logger and the metrics.
type base struct {
	cfg     Config
	records Records
	store   Store
	pub     Publisher
	log     *slog.Logger
	metrics *metrics
}
