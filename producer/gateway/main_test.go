package gateway

import (
	"testing"

	"github.com/playpipe/playpipe/producer/internal/producertest"
)

func TestMain(m *testing.M) { producertest.RunWithTelemetry(m) }
