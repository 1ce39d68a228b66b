package producer

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// spans records every span of the package's tests: the global tracer
// provider is set once, before any test, so the package's tracer delegates to it.
var spans = tracetest.NewSpanRecorder()

// promRegistry holds every metric of the package's tests, as a role's
// /metrics would (the global meter provider is set once, before any test,
// with a Prometheus exporter writing to it, as telemetry.Setup does).
var promRegistry = prometheus.NewRegistry()

func TestMain(m *testing.M) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	otel.SetTracerProvider(tp)
	exp, err := promexporter.New(promexporter.WithRegisterer(promRegistry))
	if err != nil {
		fmt.Fprintln(os.Stderr, "prometheus exporter:", err)
		os.Exit(1)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	otel.SetMeterProvider(mp)
	code := m.Run()
	_ = tp.Shutdown(context.Background())
	_ = mp.Shutdown(context.Background())
	os.Exit(code)
}
