package telemetry

import (
	"context"
	"net/http"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/trace"
)

// KafkaOption tunes KafkaHooks.
type KafkaOption func(*kafkaHookConfig)

type kafkaHookConfig struct {
	group    string
	clientID string
	noMeter  bool
}

// WithConsumerGroup sets messaging.kafka.consumer.group on consume spans.
func WithConsumerGroup(group string) KafkaOption {
	return func(c *kafkaHookConfig) { c.group = group }
}

// WithClientID sets messaging.kafka.client_id on spans.
func WithClientID(id string) KafkaOption {
	return func(c *kafkaHookConfig) { c.clientID = id }
}

// WithoutKafkaMetrics leaves out kotel's broker metrics (connects, bytes,
// records), for short-lived clients such as admin or test clients.
func WithoutKafkaMetrics() KafkaOption {
	return func(c *kafkaHookConfig) { c.noMeter = true }
}

// KafkaHooks returns the franz-go option that instruments a client with the
// kotel plugin on the global providers:
//
//   - a "<topic> publish" producer span per produced record, child of the
//     record's Context, whose W3C traceparent/tracestate are written into the
//     record headers (the same headers and propagator as Inject/Extract);
//   - a "<topic> receive" consumer span per fetched record, child of the
//     trace found in its headers (a record without one starts a new trace),
//     left in record.Context: use RecordContext to parent work on it;
//   - messaging.* attributes (semantic conventions v1.18: messaging.system,
//     messaging.destination.name / messaging.source.name, messaging.operation,
//     messaging.kafka.partition, offset, message key, consumer group);
//   - broker metrics messaging.kafka.* (connects, bytes and records
//     produced/fetched, by node and topic).
//
// Call it after Setup or before: kotel holds the global provider, which Setup
// switches. With tracing off the hooks cost a no-op span start per record.
func KafkaHooks(opts ...KafkaOption) kgo.Opt {
	var c kafkaHookConfig
	for _, o := range opts {
		o(&c)
	}
	topts := []kotel.TracerOpt{kotel.TracerPropagator(propagator)}
	if c.group != "" {
		topts = append(topts, kotel.ConsumerGroup(c.group))
	}
	if c.clientID != "" {
		topts = append(topts, kotel.ClientID(c.clientID))
	}
	kopts := []kotel.Opt{kotel.WithTracer(kotel.NewTracer(topts...))}
	if !c.noMeter {
		kopts = append(kopts, kotel.WithMeter(kotel.NewMeter(kotel.WithMergedConnectsMeter())))
	}
	return kgo.WithHooks(kotel.NewKotel(kopts...).Hooks()...)
}

// RecordContext returns ctx carrying the trace of a consumed record: the
// span that KafkaHooks left in r.Context when there is one (so work becomes a
// child of the receive span), else the remote trace context in r's headers
// (Extract). ctx keeps its own deadline and cancellation. A record with
// neither yields ctx without a span, and the next span starts a new trace.
func RecordContext(ctx context.Context, r *kgo.Record) context.Context {
	if r.Context != nil {
		if span := trace.SpanFromContext(r.Context); span.SpanContext().IsValid() {
			return trace.ContextWithSpan(ctx, span)
		}
	}
	return Extract(ctx, r)
}

// HTTPTransport wraps rt (nil: http.DefaultTransport) so that each request
// gets a client span named "<METHOD> <path template>" (numeric path segments
// read as {id}), carries W3C trace context in its headers, and records
// http.client.* metrics. Attributes follow the HTTP semantic conventions
// (http.request.method, url.full without user info, server.address,
// http.response.status_code); no request or response header becomes an
// attribute, so the Authorization token never does. Keep secrets out of URLs.
func HTTPTransport(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return otelhttp.NewTransport(rt,
		otelhttp.WithPropagators(propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			return r.Method + " " + PathTemplate(r.URL.Path)
		}),
	)
}

// HTTPHandler wraps a server handler so each request gets a server span
// (named "<name> <METHOD> <path template>") that continues the caller's
// trace, and http.server.* metrics. As with HTTPTransport, headers (the
// Authorization token among them) never become attributes.
//
// Metric labels are bounded: no label value comes from the request.
// otelhttp labels server.address and server.port from the Host header unless
// a server name is set, so any client could add a series per request (issue
// 10: random Host headers grew /metrics to 40 MB); the server name is name,
// and its port 0 means "none" (otelhttp then omits server.port rather than
// take the Host's). The other labels are bounded by otelhttp itself: method
// (unknown ones become _OTHER), status code, scheme, protocol version, and
// http.route from the ServeMux pattern (absent for unmatched paths).
func HTTPHandler(h http.Handler, name string) http.Handler {
	return otelhttp.NewHandler(h, name,
		otelhttp.WithServerName(name+":0"),
		otelhttp.WithPropagators(propagator),
		otelhttp.WithSpanNameFormatter(func(op string, r *http.Request) string {
			return op + " " + r.Method + " " + PathTemplate(r.URL.Path)
		}),
	)
}

// PathTemplate replaces the numeric segments of an URL path with {id}, so
// span names stay low-cardinality: /partners/mix/42 → /partners/mix/{id}.
func PathTemplate(p string) string {
	if !strings.ContainsAny(p, "0123456789") {
		return p
	}
	segs := strings.Split(p, "/")
	for i, s := range segs {
		if s != "" && isDigits(s) {
			segs[i] = "{id}"
		}
	}
	return strings.Join(segs, "/")
}

func isDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}
