package consumer

import (
	"context"
	"log/slog"
)

// eraseCardData deletes a message dead-lettered card_data from its stream
// once its letter, which keeps the card number masked, is filed and the
// message termed: the payments stream keeps every message until its MaxAge
// (24 h by default) whether acked or not, and the number must be kept
// nowhere. The delete overwrites the stored bytes (SecureDeleteMsg). A
// failure is logged and changes nothing else: the message then ages out.
func (w *Worker) eraseCardData(ctx context.Context, in *inbound, log *slog.Logger) {
	if in.meta == nil || in.meta.Sequence.Stream == 0 {
		return
	}
	s, err := w.js.Stream(ctx, in.meta.Stream)
	if err == nil {
		err = s.SecureDeleteMsg(ctx, in.meta.Sequence.Stream)
	}
	if err != nil {
		log.Warn("could not erase a message holding card data from its stream; it stays until the stream's MaxAge", "error", err)
	}
}
