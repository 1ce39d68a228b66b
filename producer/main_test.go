package producer_test

import (
	"testing"

	"github.com/playpipe/playpipe/testkit/producertest"
)

func TestMain(m *testing.M) { producertest.RunWithTelemetry(m) }
