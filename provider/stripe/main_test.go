package stripe_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(stopsStripeMock{m})
}

// stopsStripeMock runs the tests, then stops the stripe-mock they may have
// started, before goleak looks for goroutines left behind.
type stopsStripeMock struct{ m *testing.M }

func (s stopsStripeMock) Run() int {
	code := s.m.Run()
	stopStripeMock()
	return code
}
