package simulator

import (
	"testing"

	"github.com/playpipe/playpipe/wiring/producertest"
)

func TestMain(m *testing.M) { producertest.RunWithTelemetry(m) }
