package telemetry

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kotel"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// testScope is the instrumentation scope of the tests' own spans and instruments.
const testScope = "github.com/playpipe/playpipe/internal/telemetry/test"

// testTracer is the tests' tracer from the providers Setup returned, as a
// role gets its tracer from its Config.
func testTracer(p Providers) trace.Tracer { return p.Tracer.Tracer(testScope) }

// clearEnv unsets the OTEL_* variables Setup looks at, so a developer's
// environment cannot turn exporting on during tests.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{EnvTracesExporter, EnvMetricsExporter, EnvOTLPEndpoint, EnvOTLPTraces, EnvOTLPMetrics,
		"OTEL_TRACES_SAMPLER", "OTEL_TRACES_SAMPLER_ARG", "OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"} {
		t.Setenv(k, "")
	}
}

// setup runs Setup, registers its shutdown and returns its providers.
func setup(t *testing.T, o Config) Providers {
	t.Helper()
	p, shutdown, err := Setup(context.Background(), o)
	if err != nil {
		t.Fatalf("Setup: %v", err)
	}
	t.Cleanup(func() {
		if err := shutdown(context.Background()); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return p
}

// recording sets up tracing into an in-memory exporter; it returns the
// exporter and the providers.
func recording(t *testing.T) (*tracetest.InMemoryExporter, Providers) {
	t.Helper()
	clearEnv(t)
	exp := tracetest.NewInMemoryExporter()
	p := setup(t, Config{ServiceName: "telemetry-test", SpanExporter: exp})
	return exp, p
}

func TestSetupNothingConfiguredRecordsNothing(t *testing.T) {
	clearEnv(t)
	p, shutdown, err := Setup(context.Background(), Config{ServiceName: "t"})
	if err != nil {
		t.Fatal(err)
	}
	if tracingOn(p) {
		t.Fatal("tracing enabled with nothing configured")
	}
	tracer := testTracer(p)
	ctx, span := tracer.Start(context.Background(), "work")
	if span.IsRecording() || span.SpanContext().IsValid() {
		t.Fatalf("span with nothing configured: recording=%v valid=%v", span.IsRecording(), span.SpanContext().IsValid())
	}
	span.End()
	// No trace context to inject: the record stays without headers.
	r := &kgo.Record{}
	Inject(ctx, r)
	if len(r.Headers) != 0 {
		t.Fatalf("headers injected with tracing off: %v", r.Headers)
	}

	// An incoming trace passes through a role that does not trace.
	up := &kgo.Record{Headers: []kgo.RecordHeader{{Key: "traceparent", Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}}
	ctx, span = tracer.Start(Extract(context.Background(), up), "enrich")
	down := &kgo.Record{}
	Inject(ctx, down)
	span.End()
	if got := kotel.NewRecordCarrier(down).Get("traceparent"); got != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Fatalf("trace context not passed through with tracing off: %q", got)
	}

	if err := shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := shutdown(context.Background()); err != nil {
		t.Fatalf("second shutdown: %v", err)
	}
}

func TestSetupRejectsUnknownExporter(t *testing.T) {
	clearEnv(t)
	t.Setenv(EnvTracesExporter, "zipkin")
	_, _, err := Setup(context.Background(), Config{})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), EnvTracesExporter) {
		t.Fatalf("err = %v, want ErrInvalidConfig naming %s", err, EnvTracesExporter)
	}
	t.Setenv(EnvTracesExporter, "")
	t.Setenv(EnvMetricsExporter, "statsd")
	if _, _, err := Setup(context.Background(), Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
}

func TestExportDecisionFromEnv(t *testing.T) {
	for _, c := range []struct {
		exporter, endpoint, tracesEndpoint string
		want                               bool
	}{
		{"", "", "", false},
		{"", "http://collector:4318", "", true},
		{"", "", "http://collector:4318/v1/traces", true},
		{"none", "http://collector:4318", "", false},
		{"otlp", "", "", true},
		{"console", "", "", true},
	} {
		clearEnv(t)
		t.Setenv(EnvTracesExporter, c.exporter)
		t.Setenv(EnvOTLPEndpoint, c.endpoint)
		t.Setenv(EnvOTLPTraces, c.tracesEndpoint)
		if got, _ := exportDecision(EnvTracesExporter, EnvOTLPTraces); got != c.want {
			t.Errorf("%+v: traces exported = %v", c, got)
		}
	}
}

func TestSetupInProcessExporterRecordsSpans(t *testing.T) {
	exp, p := recording(t)
	if !tracingOn(p) {
		t.Fatal("tracing off with an in-process exporter")
	}
	_, span := testTracer(p).Start(context.Background(), "enrich")
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Name != "enrich" {
		t.Fatalf("spans = %v", spans.Snapshots())
	}
	if got := spans[0].Resource.Set(); !got.HasValue("service.name") {
		t.Fatalf("resource without service.name: %v", got)
	}

	// A second Setup (another test, another exporter) builds providers of
	// its own: their spans reach its exporter only.
	exp2 := tracetest.NewInMemoryExporter()
	p2 := setup(t, Config{SpanExporter: exp2})
	_, span = testTracer(p2).Start(context.Background(), "deliver")
	span.End()
	if n := len(exp2.GetSpans()); n != 1 {
		t.Fatalf("second exporter got %d spans, want 1", n)
	}
	if n := len(exp.GetSpans()); n != 1 {
		t.Fatalf("first exporter got %d spans after the second Setup's span, want still 1", n)
	}
}

func TestServiceNameFromEnvWins(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	clearEnv(t)
	t.Setenv("OTEL_SERVICE_NAME", "from-env")
	p := setup(t, Config{ServiceName: "from-options", SpanExporter: exp})
	_, span := testTracer(p).Start(context.Background(), "x")
	span.End()
	v, _ := exp.GetSpans()[0].Resource.Set().Value("service.name")
	if v.AsString() != "from-env" {
		t.Fatalf("service.name = %q, want from-env", v.AsString())
	}
}

// TestKafkaInjectExtractThroughBroker sends a record carrying trace context
// through the embedded broker and continues the trace on the far side.
func TestKafkaInjectExtractThroughBroker(t *testing.T) {
	exp, p := recording(t)
	tracer := testTracer(p)
	k := testenv.StartKafka(t, 1)
	topic := k.Config.Topics().Events

	ctx, pub := tracer.Start(context.Background(), "publish-event")
	rec := &kgo.Record{Topic: topic, Key: []byte("e1"), Value: []byte(`{}`)}
	Inject(ctx, rec)
	pub.End()
	cl := k.Client(t)
	if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
		t.Fatal(err)
	}

	recs := k.ReadAll(t, topic)
	if len(recs) != 1 {
		t.Fatalf("read %d records", len(recs))
	}
	cctx, enrich := tracer.Start(Extract(context.Background(), recs[0]), "enrich")
	enrich.End()
	if got, want := trace.SpanContextFromContext(cctx).TraceID(), pub.SpanContext().TraceID(); got != want {
		t.Fatalf("trace id after Kafka = %s, want %s", got, want)
	}
	var enrichSpan tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.Name == "enrich" {
			enrichSpan = s
		}
	}
	if enrichSpan.Parent.SpanID() != pub.SpanContext().SpanID() || !enrichSpan.Parent.IsRemote() {
		t.Fatalf("enrich parent = %v, want remote %s", enrichSpan.Parent.SpanID(), pub.SpanContext().SpanID())
	}

	// A record without trace context starts a new trace.
	_, fresh := tracer.Start(Extract(context.Background(), &kgo.Record{}), "enrich")
	fresh.End()
	if fresh.SpanContext().TraceID() == pub.SpanContext().TraceID() || !fresh.SpanContext().IsValid() {
		t.Fatal("record without headers did not start a new trace")
	}
}

// scrape returns the sum of the samples of a Prometheus metric family.
func scrape(t *testing.T, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	return sumSamples(t, resp.Body, name, "")
}

func sumSamples(t *testing.T, r io.Reader, name, labelFilter string) float64 {
	t.Helper()
	var sum float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") && !strings.HasPrefix(line, name+" ") {
			continue
		}
		if labelFilter != "" && !strings.Contains(line, labelFilter) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		sum += v
	}
	return sum
}

func TestAdminServerEndpoints(t *testing.T) {
	clearEnv(t)
	p := setup(t, Config{ServiceName: "admin-test"})
	events, err := pkgMeter(p).Int64Counter("playpipe.events.in")
	if err != nil {
		t.Fatal(err)
	}
	latency, err := pkgMeter(p).Float64Histogram("playpipe.delivery.latency", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}

	a := NewAdminServer("127.0.0.1:0", nil)
	var broken atomic.Bool
	a.AddReadyCheck("kafka", func(context.Context) error {
		if broken.Load() {
			return errors.New("broker unreachable")
		}
		return nil
	})
	if _, err := a.Listen(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	base := "http://" + a.Addr()

	events.Add(context.Background(), 5)
	before := scrape(t, base+"/metrics", "playpipe_events_in_total")
	events.Add(context.Background(), 3)
	latency.Record(context.Background(), 0.02)
	if after := scrape(t, base+"/metrics", "playpipe_events_in_total"); after-before != 3 {
		t.Fatalf("playpipe_events_in_total moved by %v, want 3", after-before)
	}
	if n := scrape(t, base+"/metrics", "playpipe_delivery_latency_seconds_count"); n < 1 {
		t.Fatalf("delivery latency histogram count = %v", n)
	}

	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Fatalf("/healthz = %d", code)
	}
	if code, body := get("/readyz"); code != 200 {
		t.Fatalf("/readyz = %d %s", code, body)
	}
	broken.Store(true)
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "kafka: broker unreachable") {
		t.Fatalf("/readyz with a failing check = %d %q", code, body)
	}
	broken.Store(false)
	if code, _ := get("/readyz"); code != 200 {
		t.Fatalf("/readyz after recovery = %d", code)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	if err := a.Ready(context.Background()); err == nil {
		t.Fatal("ready after shutdown")
	}
}

func TestLoggerAddsTraceIDsAndRedacts(t *testing.T) {
	_, p := recording(t)
	tracer := testTracer(p)
	var buf bytes.Buffer
	log, err := NewLogger(&buf, "json", "info")
	if err != nil {
		t.Fatal(err)
	}
	const sig = "0123456789abcdef0123456789abcdef01234567"
	const token = "eyJhbGciOiJIUzI1NiJ9.secret-token"
	ctx, span := tracer.Start(context.Background(), "deliver")
	log.With("role", "report").InfoContext(ctx, "delivered",
		"client_signature", Redacted(sig),
		"Authorization", "Bearer "+token,
		slog.Group("session", "token", token))
	span.End()
	log.Info("no span")

	out := buf.String()
	if strings.Contains(out, sig) || strings.Contains(out, token) {
		t.Fatalf("secret in log output: %s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil {
		t.Fatal(err)
	}
	if rec[LogTraceID] != span.SpanContext().TraceID().String() || rec[LogSpanID] != span.SpanContext().SpanID().String() {
		t.Fatalf("record ids = %v/%v, want %s/%s", rec[LogTraceID], rec[LogSpanID], span.SpanContext().TraceID(), span.SpanContext().SpanID())
	}
	if rec["client_signature"] != "[REDACTED]" || rec["Authorization"] != "[REDACTED]" {
		t.Fatalf("redacted values = %v, %v", rec["client_signature"], rec["Authorization"])
	}
	if strings.Contains(lines[1], LogTraceID) {
		t.Fatalf("trace id on a record without span: %s", lines[1])
	}
	if _, err := NewLogger(io.Discard, "xml", "info"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad format: %v", err)
	}
	if _, err := NewLogger(io.Discard, "text", "loud"); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("bad level: %v", err)
	}
}

func TestRedactedKeepsEmpty(t *testing.T) {
	if Redacted("").String() != "" || Redacted("x").String() != "[REDACTED]" {
		t.Error("Redacted: empty must stay empty, anything else [REDACTED]")
	}
}

func TestHTTPWrappersPropagateAndKeepTokensOut(t *testing.T) {
	exp, p := recording(t)
	tracer := testTracer(p)
	const token = "tok-very-secret-0123456789"
	var serverTrace trace.TraceID
	srv := httptest.NewServer(HTTPHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serverTrace = trace.SpanContextFromContext(r.Context()).TraceID()
		w.WriteHeader(http.StatusOK)
	}), "sandbox", p))
	defer srv.Close()

	client := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithPropagators(propagator))}
	ctx, parent := tracer.Start(context.Background(), "deliver")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/partners/mix/42", strings.NewReader(`{}`))
	req.Header.Set("Authorization", token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body) //nolint:errcheck
	resp.Body.Close()
	parent.End()

	if serverTrace != parent.SpanContext().TraceID() {
		t.Fatal("server span is not in the client's trace")
	}
	names := map[string]bool{}
	for _, s := range exp.GetSpans() {
		names[s.Name] = true
		for _, a := range s.Attributes {
			if strings.Contains(a.Value.String(), token) || strings.Contains(strings.ToLower(string(a.Key)), "authorization") {
				t.Fatalf("span %s carries the token in %s", s.Name, a.Key)
			}
		}
	}
	if !names["sandbox POST /partners/mix/{id}"] {
		t.Fatalf("span names = %v", names)
	}
}

func TestPathTemplate(t *testing.T) {
	for in, want := range map[string]string{
		"/partners/mix/42":              "/partners/mix/{id}",
		"/partners/royalty-tracking":    "/partners/royalty-tracking",
		"/partners/catalog/7/restrict2": "/partners/catalog/{id}/restrict2",
		"/":                             "/",
	} {
		if got := PathTemplate(in); got != want {
			t.Errorf("PathTemplate(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestConsumerLagGauge(t *testing.T) {
	clearEnv(t)
	p := setup(t, Config{})
	k := testenv.StartKafka(t, 2)
	topic := k.Config.Topics().Reports
	cl := k.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	for i := 0; i < 10; i++ {
		r := &kgo.Record{Topic: topic, Partition: int32(i % 2), Value: []byte("x")}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	adm := kadm.NewClient(cl)
	// The group has committed 2 records of partition 0 and none of partition 1.
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 2, LeaderEpoch: -1})
	if _, err := adm.CommitOffsets(context.Background(), "lag-g", offs); err != nil {
		t.Fatal(err)
	}
	reg, err := RegisterConsumerLag(pkgMeter(p), adm, "lag-g",
		ConsumerLagOptions{Topics: []string{topic}, MinInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister() //nolint:errcheck

	srv := httptest.NewServer(MetricsHandler())
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	p0 := sumSamples(t, bytes.NewReader(body), "playpipe_consumer_lag", `partition="0"`)
	p1 := sumSamples(t, bytes.NewReader(body), "playpipe_consumer_lag", `partition="1"`)
	if p0 != 3 || p1 != 5 || !strings.Contains(string(body), `group="lag-g"`) {
		t.Fatalf("lag p0=%v p1=%v, want 3 and 5:\n%s", p0, p1, grep(string(body), "playpipe_consumer_lag"))
	}

	if _, err := RegisterConsumerLag(metricnoop.NewMeterProvider().Meter("x"), nil, "", ConsumerLagOptions{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("missing client: %v", err)
	}
}

// TestConsumerLagTransactional: a topic written in transactions ends with
// a commit marker, so end − committed reads 1 when the group has consumed
// everything; with the client given, the gauge reads 0 there, and still
// counts the records really pending (committed records past the commit).
func TestConsumerLagTransactional(t *testing.T) {
	clearEnv(t)
	p := setup(t, Config{})
	k := testenv.StartKafka(t, 2)
	topic := k.Config.Topics().Reports
	ctx := context.Background()
	tx := k.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.TransactionalID("lag-tx"))
	txn := func(n int) {
		if err := tx.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := 0; i < n; i++ {
			for p := int32(0); p < 2; p++ {
				if err := tx.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: p, Value: []byte("x")}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := tx.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	txn(3) // offsets 0–2 records, 3 the commit marker
	cl := k.Client(t)
	adm := kadm.NewClient(cl)
	// Partition 0 consumed everything (3 records), partition 1 one record.
	offs := kadm.Offsets{}
	offs.Add(kadm.Offset{Topic: topic, Partition: 0, At: 3, LeaderEpoch: -1})
	offs.Add(kadm.Offset{Topic: topic, Partition: 1, At: 1, LeaderEpoch: -1})
	if _, err := adm.CommitOffsets(ctx, "lag-tx-g", offs); err != nil {
		t.Fatal(err)
	}
	scrapeLag := func(reg metric.Registration) (float64, float64) {
		t.Helper()
		srv := httptest.NewServer(MetricsHandler())
		defer srv.Close()
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return sumSamples(t, bytes.NewReader(body), "playpipe_consumer_lag", `partition="0"`),
			sumSamples(t, bytes.NewReader(body), "playpipe_consumer_lag", `partition="1"`)
	}
	// Without the client: kadm.Lag's figure, the marker counted.
	raw, err := RegisterConsumerLag(pkgMeter(p), adm, "lag-tx-g", ConsumerLagOptions{Topics: []string{topic}, MinInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	p0, p1 := scrapeLag(raw)
	_ = raw.Unregister()
	if p0 != 1 || p1 != 3 {
		t.Fatalf("kadm.Lag figures p0=%v p1=%v, want 1 (the marker) and 3", p0, p1)
	}
	reg, err := RegisterConsumerLag(pkgMeter(p), adm, "lag-tx-g", ConsumerLagOptions{Topics: []string{topic}, MinInterval: time.Millisecond, Client: cl})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Unregister() //nolint:errcheck
	if p0, p1 := scrapeLag(reg); p0 != 0 || p1 != 2 {
		t.Fatalf("checked lag p0=%v p1=%v, want 0 (idle) and 2", p0, p1)
	}
	// A second transaction: both partitions have 2 more records pending.
	txn(2)
	// The first scrape after a change may still serve the previous
	// collection's values (seen with the Prometheus exporter here); the
	// next one reads the new lag. The pause outlasts MinInterval (1 ms), the
	// gauge's own clock-based reuse period: time must pass, there is no
	// event to wait for.
	time.Sleep(10 * time.Millisecond)
	scrapeLag(reg)
	if p0, p1 := scrapeLag(reg); p0 != 2 || p1 != 4 {
		t.Fatalf("after a second transaction p0=%v p1=%v, want 2 and 4", p0, p1)
	}
}

func grep(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// pkgMeter is the tests' meter from the providers Setup returned.
func pkgMeter(p Providers) metric.Meter { return p.Meter.Meter(testScope) }

// TestPrometheusNames pins how the roles' instrument names (reporter,
// consumer, analytics, declared there) read in Prometheus, as
// docs/operating.md and the alert rules use them: dots become underscores,
// counters get _total, seconds histograms _seconds and LatencyBuckets.
func TestPrometheusNames(t *testing.T) {
	clearEnv(t)
	m := pkgMeter(setup(t, Config{}))
	counter := func(name string) metric.Int64Counter {
		c, err := m.Int64Counter(name)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	events, rejected, deliveries := counter("playpipe.events.in"), counter("playpipe.events.rejected"), counter("playpipe.deliveries")
	active, err := m.Int64UpDownCounter("playpipe.standby.active")
	if err != nil {
		t.Fatal(err)
	}
	// A histogram made without boundaries gets LatencyBuckets.
	insert, err := m.Float64Histogram("playpipe.sink.insert.duration", metric.WithUnit("s"))
	if err != nil {
		t.Fatal(err)
	}
	// A gauge in seconds stays a gauge (the view of histograms in seconds
	// must not make it one): the stuck-report alert reads it.
	var age atomic.Int64
	if _, err := m.Float64ObservableGauge("playpipe.test.oldest_age", metric.WithUnit("s"),
		metric.WithFloat64Callback(func(_ context.Context, o metric.Float64Observer) error {
			o.Observe(float64(age.Load()))
			return nil
		})); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(MetricsHandler())
	defer srv.Close()
	ctx := context.Background()
	steps := []struct {
		series string
		filter string
		do     func()
		want   float64
	}{
		{"playpipe_events_in_total", "", func() { events.Add(ctx, 2) }, 2},
		{"playpipe_events_rejected_total", `reason="missing_user_id"`, func() {
			rejected.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", "missing_user_id")))
		}, 1},
		{"playpipe_deliveries_total", `outcome="delivered"`, func() {
			deliveries.Add(ctx, 1, metric.WithAttributes(attribute.String("outcome", "delivered")))
		}, 1},
		{"playpipe_standby_active", "", func() { active.Add(ctx, 1) }, 1},
		{"playpipe_standby_active", "", func() { active.Add(ctx, -1) }, -1},
		{"playpipe_sink_insert_duration_seconds_bucket", `le="0.05"`, func() { insert.Record(ctx, 0.04) }, 1},
		{"playpipe_sink_insert_duration_seconds_bucket", `le="0.25"`, func() { insert.Record(ctx, 0.2) }, 1},
		{"playpipe_test_oldest_age_seconds", "", func() { age.Store(1800) }, 1800},
	}
	read := func(series, filter string) float64 {
		resp, err := http.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return sumSamples(t, resp.Body, series, filter)
	}
	for _, s := range steps {
		before := read(s.series, s.filter)
		s.do()
		if got := read(s.series, s.filter) - before; got != s.want {
			t.Errorf("%s{%s} moved by %v, want %v", s.series, s.filter, got, s.want)
		}
	}
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(body), "# TYPE playpipe_test_oldest_age_seconds gauge") {
		t.Errorf("a gauge in seconds is not exported as a gauge:\n%s", grepLines(string(body), "oldest_age"))
	}
}

// grepLines is the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// tracingOn reports whether p's tracer provider records spans.
func tracingOn(p Providers) bool {
	_, off := p.Tracer.(noop.TracerProvider)
	return !off
}

func TestStartRole(t *testing.T) {
	clearEnv(t)
	tel, err := StartRole(context.Background(), "consume", "127.0.0.1:0", nil)
	if err != nil {
		t.Fatal(err)
	}
	tel.AddReadyCheck("never", func(context.Context) error { return errors.New("not yet") })
	resp, err := http.Get("http://" + tel.Admin.Addr() + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("/readyz = %d", resp.StatusCode)
	}
	addr := tel.Admin.Addr()
	if err := tel.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tel.Close(context.Background()); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Fatal("admin server still serving after Close")
	}

	off, err := StartRole(context.Background(), "sink", "off", nil)
	if err != nil || off.Admin != nil {
		t.Fatalf("off: %v %v", err, off.Admin)
	}
	off.AddReadyCheck("x", nil)
	if err := off.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestOTLPExportFromEnv configures export only through the standard
// variables and checks that an OTLP/HTTP receiver on loopback gets the span.
func TestOTLPExportFromEnv(t *testing.T) {
	clearEnv(t)
	got := make(chan *coltracepb.ExportTraceServiceRequest, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/metrics" { // pushed too when this test runs first
			w.Header().Set("Content-Type", "application/x-protobuf")
			return
		}
		if r.URL.Path != "/v1/traces" {
			w.WriteHeader(http.StatusNotFound)
			return
		}
		body, _ := io.ReadAll(r.Body)
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		got <- &req
		w.Header().Set("Content-Type", "application/x-protobuf")
		b, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(b)
	}))
	defer srv.Close()
	t.Setenv(EnvOTLPEndpoint, srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	t.Setenv("OTEL_SERVICE_NAME", "playpipe-otlp-test")

	p, shutdown, err := Setup(context.Background(), Config{ServiceName: "ignored"})
	if err != nil {
		t.Fatal(err)
	}
	_, span := testTracer(p).Start(context.Background(), "deliver")
	span.End()
	if err := shutdown(context.Background()); err != nil { // flushes the batch
		t.Fatal(err)
	}
	select {
	case req := <-got:
		var found bool
		for _, rs := range req.ResourceSpans {
			var svc string
			for _, a := range rs.Resource.Attributes {
				if a.Key == "service.name" {
					svc = a.Value.GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					if s.Name == "deliver" && trace.TraceID(s.TraceId) == span.SpanContext().TraceID() && svc == "playpipe-otlp-test" {
						found = true
					}
				}
			}
		}
		if !found {
			t.Fatalf("exported request lacks the span: %v", req)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("nothing exported to the OTLP endpoint")
	}
}

// TestReadyAnswersWithinASecond registers a check that ignores its context
// and never returns (a part that hangs) beside a quick one: Ready must
// answer within a second, naming the silent check's count, and the quick
// check's error must still be there.
func TestReadyAnswersWithinASecond(t *testing.T) {
	a := NewAdminServer("127.0.0.1:0", nil)
	hang := make(chan struct{})
	defer close(hang)
	a.AddReadyCheck("kafka", func(context.Context) error { <-hang; return nil })
	a.AddReadyCheck("clickhouse", func(context.Context) error { return errors.New("connection refused") })
	start := time.Now()
	err := a.Ready(context.Background())
	if d := time.Since(start); d > time.Second {
		t.Errorf("Ready took %s with a hanging check", d)
	}
	if err == nil || !strings.Contains(err.Error(), "no answer within") || !strings.Contains(err.Error(), "clickhouse: connection refused") {
		t.Fatalf("Ready = %v", err)
	}
}
