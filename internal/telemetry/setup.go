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
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	promexporter "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
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

// Setup installs the global tracer provider, meter provider and propagator
// for this process, configured by Config and the standard OTEL_* variables,
// and returns the function that flushes and stops what it started.
//
// Traces: when neither the environment nor Config.SpanExporter exports spans,
// the global tracer stays a no-op that only carries incoming trace context
// forward (no ids are generated, nothing is recorded). Otherwise an SDK
// tracer provider samples by OTEL_TRACES_SAMPLER (default
// parentbased_always_on) and exports in batches (OTLP over gRPC or
// http/protobuf per OTEL_EXPORTER_OTLP_PROTOCOL, or console).
//
// Metrics are always collected and served for Prometheus by MetricsHandler
// (its own registry, not prometheus.DefaultRegisterer); they are also pushed
// by OTLP when OTEL_METRICS_EXPORTER=otlp|console or an OTLP endpoint is set.
// The meter provider is process-wide: the first Setup creates it and later
// calls reuse it (instruments created through the global API bind to the
// first provider installed, so swapping it would lose them).
//
// Setup may be called again (tests do): each call replaces the tracing
// configuration. shutdown is idempotent; it flushes and stops this call's span
// exporters and, for the call that created it, the OTLP metric reader.
func Setup(ctx context.Context, o Config) (shutdown func(context.Context) error, err error) {
	tracesOn, err := exportDecision(EnvTracesExporter, EnvOTLPTraces)
	if err != nil {
		return nil, err
	}
	metricsOTLP, err := exportDecision(EnvMetricsExporter, EnvOTLPMetrics)
	if err != nil {
		return nil, err
	}
	res, err := newResource(ctx, o)
	if err != nil {
		return nil, err
	}

	otel.SetTextMapPropagator(propagator)
	installGlobals()

	var stops []func(context.Context) error

	// Metrics: once per process.
	stopMetrics, err := ensureMeterProvider(ctx, res, metricsOTLP)
	if err != nil {
		return nil, err
	}
	if stopMetrics != nil {
		stops = append(stops, stopMetrics)
	}

	// Traces.
	if tracesOn || o.SpanExporter != nil {
		topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
		if o.Sampler != nil {
			topts = append(topts, sdktrace.WithSampler(o.Sampler))
		}
		if tracesOn {
			exp, err := autoexport.NewSpanExporter(ctx)
			if err != nil {
				return nil, fmt.Errorf("telemetry: traces exporter: %w", err)
			}
			topts = append(topts, sdktrace.WithBatcher(exp))
		}
		if o.SpanExporter != nil {
			topts = append(topts, sdktrace.WithSyncer(o.SpanExporter))
		}
		tp := sdktrace.NewTracerProvider(topts...)
		tracing.set(tp)
		stops = append(stops, func(ctx context.Context) error {
			tracing.unset(tp)
			return tp.Shutdown(ctx)
		})
	} else {
		tracing.set(noop.NewTracerProvider())
	}

	var once sync.Once
	var shutdownErr error
	return func(ctx context.Context) error {
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
// and returns the stop function of the OTLP reader it started (nil when none
// or when the provider already existed).
func ensureMeterProvider(ctx context.Context, res *resource.Resource, otlp bool) (func(context.Context) error, error) {
	metricsMu.Lock()
	defer metricsMu.Unlock()
	if meterProvider != nil {
		return nil, nil
	}
	prom, err := promexporter.New(promexporter.WithRegisterer(promRegistry))
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	mopts := []sdkmetric.Option{sdkmetric.WithResource(res), sdkmetric.WithReader(prom),
		// Seconds histograms get second-scale buckets (the SDK default is for ms).
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Name: "playpipe.*", Unit: "s"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{Boundaries: LatencyBuckets}},
		))}
	var otlpReader sdkmetric.Reader
	if otlp {
		otlpReader, err = autoexport.NewMetricReader(ctx)
		if err != nil {
			return nil, fmt.Errorf("telemetry: metrics exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(otlpReader))
	}
	meterProvider = sdkmetric.NewMeterProvider(mopts...)
	otel.SetMeterProvider(meterProvider)
	if otlpReader == nil {
		return func(ctx context.Context) error { return meterProvider.ForceFlush(ctx) }, nil
	}
	return func(ctx context.Context) error {
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

// ---- traces: a global provider whose implementation Setup can swap ----

// tracing is the tracer provider installed globally. Instrumentation obtains
// tracers once (often at package init) and keeps them, and the global API
// binds to the first provider set; routing through a switchable provider lets
// every Setup (one per test, for instance) take effect for all of them.
var tracing = &switchProvider{}

func init() { tracing.set(noop.NewTracerProvider()) }

var globalsOnce sync.Once

func installGlobals() {
	globalsOnce.Do(func() { otel.SetTracerProvider(tracing) })
}

type providerGen struct {
	tp  trace.TracerProvider
	gen uint64
}

type switchProvider struct {
	embedded.TracerProvider
	cur atomic.Pointer[providerGen]
	mu  sync.Mutex
}

func (p *switchProvider) set(tp trace.TracerProvider) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var gen uint64
	if c := p.cur.Load(); c != nil {
		gen = c.gen + 1
	}
	p.cur.Store(&providerGen{tp: tp, gen: gen})
}

// unset reverts to the no-op provider when tp is still the current one.
func (p *switchProvider) unset(tp trace.TracerProvider) {
	p.mu.Lock()
	c := p.cur.Load()
	p.mu.Unlock()
	if c != nil && c.tp == tp {
		p.set(noop.NewTracerProvider())
	}
}

func (p *switchProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return &switchTracer{p: p, name: name, opts: opts}
}

type tracerGen struct {
	t   trace.Tracer
	gen uint64
}

type switchTracer struct {
	embedded.Tracer
	p    *switchProvider
	name string
	opts []trace.TracerOption
	cur  atomic.Pointer[tracerGen]
}

func (t *switchTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	pg := t.p.cur.Load()
	tg := t.cur.Load()
	if tg == nil || tg.gen != pg.gen {
		tg = &tracerGen{t: pg.tp.Tracer(t.name, t.opts...), gen: pg.gen}
		t.cur.Store(tg)
	}
	return tg.t.Start(ctx, name, opts...)
}
