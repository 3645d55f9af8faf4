package intake_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/paydedup/paydedup/lab/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.LeakOptions()...)
}
