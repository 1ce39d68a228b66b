package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/otel/attribute"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/playpipe/playpipe/internal/version"
)

// Config configures Setup. The zero value is valid: service "playpipe",
// exporters from the OTEL_* environment only.
type Config struct {
	// ServiceName is the service.name resource attribute; defaults to
	// "playpipe". OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it.
	ServiceName string
	// Version is service.version; defaults to internal/version.Version.
	Version string
	// Attributes are extra resource attributes (e.g. playpipe.role); the
	// environment overrides them too.
	Attributes []attribute.KeyValue

	// SpanExporter, when set, receives every sampled span synchronously as it
	// ends (tests: tracetest.NewInMemoryExporter()). It is added to any
	// exporter configured by the environment and turns tracing on.
	SpanExporter sdktrace.SpanExporter
	// Sampler overrides OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG
	// (default parentbased_always_on).
	Sampler sdktrace.Sampler
}

// Environment variables read by Setup itself (the SDK and the OTLP exporters
// read the rest of the OTEL_* family: endpoints, headers, protocol, sampler,
// batch processor, resource attributes).
//
// The one exception to "only cmd/playpipe reads the environment"
// (a decision): the OTEL_* family is OpenTelemetry's standard
// configuration, which the SDK and its exporters (autoexport) read
// themselves wherever they run; Setup reads these five to make the same
// choice the SDK makes (and to export nothing when no endpoint is set).
// Reading them in cmd/playpipe instead would split one standard's reading
// between two places. playpipe's own PLAYPIPE_* variables are read only in
// cmd/playpipe.
const (
	EnvTracesExporter  = "OTEL_TRACES_EXPORTER"
	EnvMetricsExporter = "OTEL_METRICS_EXPORTER"
	EnvOTLPEndpoint    = "OTEL_EXPORTER_OTLP_ENDPOINT"
	EnvOTLPTraces      = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
	EnvOTLPMetrics     = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"
)

// ErrInvalidConfig is wrapped by every configuration error Setup returns.
var ErrInvalidConfig = errors.New("telemetry: invalid configuration")

// exportDecision says whether a signal is exported and through which
// autoexport name.
func exportDecision(exporterVar, endpointVar string) (bool, error) {
	v := strings.ToLower(strings.TrimSpace(os.Getenv(exporterVar)))
	switch v {
	case "":
		// The spec's default is "otlp", but exporting to localhost:4318 when
		// nothing is configured would make every process retry a dead port.
		// playpipe exports only when an endpoint is set.
		return os.Getenv(EnvOTLPEndpoint) != "" || os.Getenv(endpointVar) != "", nil
	case "none":
		return false, nil
	case "otlp", "console":
		return true, nil
	case "prometheus":
		if exporterVar == EnvMetricsExporter {
			return false, nil // always served on the admin port's /metrics
		}
	}
	accepted := "otlp, console, none"
	if exporterVar == EnvMetricsExporter {
		accepted = "otlp, console, prometheus, none"
	}
	return false, fmt.Errorf("%w: %s=%q; accepted: %s (one value)", ErrInvalidConfig, exporterVar, v, accepted)
}

// Setup builds this process's tracer provider, meter provider and
// propagator, configured by Config and the standard OTEL_* variables, and
// returns them (to hand to the roles' Config fields) with the function that
// flushes and stops what it started. It sets none of the otel globals: a
// library instruments itself with the providers it is given, no-ops when
// given none.
//
// Traces: when neither the environment nor Config.SpanExporter exports spans,
// the tracer provider is a no-op that only carries incoming trace context
// forward (no ids are generated, nothing is recorded). Otherwise an SDK
// tracer provider samples by OTEL_TRACES_SAMPLER (default
// parentbased_always_on) and exports in batches (OTLP over gRPC or
// http/protobuf per OTEL_EXPORTER_OTLP_PROTOCOL, or console).
//
// Metrics are always collected and served for Prometheus by MetricsHandler
// (its own registry, not prometheus.DefaultRegisterer); they are also pushed
// by OTLP when OTEL_METRICS_EXPORTER=otlp|console or an OTLP endpoint is set.
// The meter provider is process-wide, like the registry MetricsHandler
// serves: the first Setup creates it and later calls return it again (a
// second provider would register the same series twice).
//
// Setup may be called again (tests do): each call builds a tracer provider
// of its own. shutdown is idempotent; it flushes and stops this call's span
// exporters and, for the call that created it, the OTLP metric reader.
func Setup(ctx context.Context, o Config) (p Providers, shutdown func(context.Context) error, err error) {
	tracesOn, err := exportDecision(EnvTracesExporter, EnvOTLPTraces)
	if err != nil {
		return Providers{}, nil, err
	}
	metricsOTLP, err := exportDecision(EnvMetricsExporter, EnvOTLPMetrics)
	if err != nil {
		return Providers{}, nil, err
	}
	res, err := newResource(ctx, o)
	if err != nil {
		return Providers{}, nil, err
	}

	var stops []func(context.Context) error

	// Metrics: once per process.
	mp, stopMetrics, err := ensureMeterProvider(ctx, res, metricsOTLP)
	if err != nil {
		return Providers{}, nil, err
	}
	if stopMetrics != nil {
		stops = append(stops, stopMetrics)
	}

	tp, stopTraces, err := newTracerProvider(ctx, res, o, tracesOn)
	if err != nil {
		return Providers{}, nil, err
	}
	if stopTraces != nil {
		stops = append(stops, stopTraces)
	}

	var once sync.Once
	var shutdownErr error
	return Providers{Meter: mp, Tracer: tp, Propagator: propagator}, func(ctx context.Context) error {
		once.Do(func() {
			var errs []error
			for i := len(stops) - 1; i >= 0; i-- {
				errs = append(errs, stops[i](ctx))
			}
			shutdownErr = errors.Join(errs...)
		})
		return shutdownErr
	}, nil
}

// newTracerProvider builds the tracer provider Setup returns: an SDK one
// when spans are exported (by the environment or o.SpanExporter), with the
// function that flushes and stops it, or a no-op one (stop nil).
func newTracerProvider(ctx context.Context, res *resource.Resource, o Config, tracesOn bool) (trace.TracerProvider, func(context.Context) error, error) {
	if !tracesOn && o.SpanExporter == nil {
		return noop.NewTracerProvider(), nil, nil
	}
	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if o.Sampler != nil {
		topts = append(topts, sdktrace.WithSampler(o.Sampler))
	}
	if tracesOn {
		exp, err := autoexport.NewSpanExporter(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("telemetry: traces exporter: %w", err)
		}
		topts = append(topts, sdktrace.WithBatcher(exp))
	}
	if o.SpanExporter != nil {
		topts = append(topts, sdktrace.WithSyncer(o.SpanExporter))
	}
	tp := sdktrace.NewTracerProvider(topts...)
	return tp, tp.Shutdown, nil
}

func newResource(ctx context.Context, o Config) (*resource.Resource, error) {
	name := o.ServiceName
	if name == "" {
		name = "playpipe"
	}
	ver := o.Version
	if ver == "" {
		ver = version.Version
	}
	attrs := append([]attribute.KeyValue{
		attribute.String("service.name", name),
		attribute.String("service.version", ver),
	}, o.Attributes...)
	res, err := resource.New(ctx,
		resource.WithAttributes(attrs...),
		resource.WithTelemetrySDK(),
		resource.WithHost(),
		resource.WithProcessPID(),
		resource.WithFromEnv(), // last: OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME win
	)
	if err != nil && res == nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	// A partial resource (e.g. an unreadable host name) is still usable.
	return res, nil
}

// ---- metrics: one provider per process ----

var (
	metricsMu       sync.Mutex
	meterProvider   *sdkmetric.MeterProvider
	promRegistry    = prometheus.NewRegistry()
	metricsHandler  = promhttp.HandlerFor(promRegistry, promhttp.HandlerOpts{Registry: promRegistry})
	otlpMetricsStop atomic.Bool
)

// ensureMeterProvider creates the process-wide meter provider on first call
// and returns it with the stop function of the OTLP reader it started (nil
// when none or when the provider already existed).
func ensureMeterProvider(ctx context.Context, res *resource.Resource, otlp bool) (*sdkmetric.MeterProvider, func(context.Context) error, error) {
	metricsMu.Lock()
	defer metricsMu.Unlock()
	if meterProvider != nil {
		return meterProvider, nil, nil
	}
	prom, err := promexporter.New(promexporter.WithRegisterer(promRegistry))
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom),
		// Seconds histograms get second-scale buckets (the SDK default is for
		// ms). Histograms only: a view without a kind would make every
		// instrument in seconds one, gauges included (an age, a round trip),
		// and no alert on a gauge's value would match a series.
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Name: "playpipe.*", Unit: "s", Kind: sdkmetric.InstrumentKindHistogram},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: LatencyBuckets}},
		))}
	var otlpReader sdkmetric.Reader
	if otlp {
		otlpReader, err = autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, nil, fmt.Errorf("telemetry: metrics exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(otlpReader))
	}
	mp := sdkmetric.NewMeterProvider(mopts...)
	meterProvider = mp
	if otlpReader == nil {
		return mp, func(ctx context.Context) error { return mp.ForceFlush(ctx) }, nil
	}
	return mp, func(ctx context.Context) error {
		// Stop the push reader (it exports a last time); the Prometheus pull reader stays.
		if otlpMetricsStop.Swap(true) {
			return nil
		}
		return otlpReader.Shutdown(ctx) // a periodic reader exports once more on Shutdown
	}, nil
}

// MetricsHandler serves the process's metrics in the Prometheus exposition
// format (the registry Setup's Prometheus exporter writes to). Before Setup it
// serves an empty registry.
func MetricsHandler() http.Handler { return metricsHandler }
