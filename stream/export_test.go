package stream

import "github.com/nats-io/nats.go"

// LegacySignForTest signs m as workers did before letters named their key:
// Dlq-Auth with key, no Dlq-Key-Id.
func LegacySignForTest(key []byte, m *nats.Msg) {
	m.Header.Del(HeaderDLQKeyID)
	m.Header.Set(HeaderDLQAuth, letterMAC(key, m.Header, m.Data))
}
