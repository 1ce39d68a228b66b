package telemetry

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
)

// HTTPHandler wraps a server handler so each request gets a server span
// (named "<name> <METHOD> <path template>") that continues the caller's
// trace, and http.server.* metrics, made with p's providers (p.WithDefaults:
// a nil field is a no-op provider, a nil propagator playpipe's W3C one). No
// header (the Authorization token among them) becomes an attribute.
//
// Metric labels are bounded: no label value comes from the request.
// otelhttp labels server.address and server.port from the Host header unless
// a server name is set, so any client could add a series per request (issue
// 10: random Host headers grew /metrics to 40 MB); the server name is name,
// and its port 0 means "none" (otelhttp then omits server.port rather than
// take the Host's). The other labels are bounded by otelhttp itself: method
// (unknown ones become _OTHER), status code, scheme, protocol version, and
// http.route from the ServeMux pattern (absent for unmatched paths).
func HTTPHandler(h http.Handler, name string, p Providers) http.Handler {
	p = p.WithDefaults()
	return otelhttp.NewHandler(h, name,
		otelhttp.WithServerName(name+":0"),
		otelhttp.WithTracerProvider(p.Tracer),
		otelhttp.WithMeterProvider(p.Meter),
		otelhttp.WithPropagators(p.Propagator),
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
