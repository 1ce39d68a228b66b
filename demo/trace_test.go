package demo_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/demo"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
	"github.com/playpipe/playpipe/wiring/roles"
)

// TestTraceEndToEnd publishes one event and follows it: one trace must link
// the publish, the enrich, the produce of its track plays, their consume and
// delivery, with the partner API's HTTP span inside, and the same trace id
// must be in the ClickHouse deliveries rows that `playpipe audit --list`
// shows.
func TestTraceEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	exp := tracetest.NewInMemoryExporter()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := telemetry.Config{ServiceName: "playpipe-test", SpanExporter: exp}
	if os.Getenv("NOTRACE") != "" {
		opts.SpanExporter = nil
	}
	tel, shutdown, err := telemetry.Setup(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = shutdown(context.Background()) }()

	k := testenv.StartKafka(t, 2)
	ch := testenv.StartClickHouse(t)
	p, err := demo.Start(ctx, demo.Config{
		Kafka:      k.Config,
		Sandbox:    sandbox.Config{Seed: 3, Pages: 1, ListsPerPage: 1, MixesPerList: 2},
		ClickHouse: analytics.Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password},
		Consumer:   consumer.Config{TransactionalID: "trace-enrich", KafkaOpts: nil},
		Sink:       analytics.SinkConfig{BatchRows: 100, Linger: 100 * time.Millisecond},
		Logger:     testenv.Logger(t),
		Telemetry:  tel,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	mix := p.Sandbox.Catalog().Mixes[0]
	ev := fmt.Sprintf(`{"event_id":"trace-1","mix_id":%d,"started_at":%d,"offset_ms":0,"duration_ms":%d,`+
		`"user_id":"u-trace","country":"DE","os":"Android 15","device":"phone","vendor":4}`, mix.ID, time.Now().Add(-time.Hour).UnixMilli(), (mix.Tracks[1].StartSec+5)*1000)
	pcfg := roles.Publisher(p.Kafka)
	pcfg.TracerProvider, pcfg.MeterProvider = tel.Tracer, tel.Meter
	pub, err := producer.NewPublisher(ctx, pcfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close(context.Background())
	res, err := pub.Publish(ctx, [][]byte{[]byte(ev)})
	if err != nil || res[0].Err != nil {
		t.Fatalf("publish: %v %+v", err, res)
	}

	// Wait until the ledger shows the three plays delivered.
	conn := ch.Conn(t)
	auditor, err := analytics.NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	window := analytics.AuditOptions{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	var rows []analytics.ListRow
	for deadline := time.Now().Add(20 * time.Second); ; {
		rows, err = auditor.List(ctx, window, "delivered", 10)
		if err == nil && len(rows) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered: %d rows, %v", len(rows), err)
		}
		time.Sleep(200 * time.Millisecond)
	}

	spans := exp.GetSpans()
	var publish tracetest.SpanStub
	for _, s := range spans {
		if s.Name == "publish plays.events" {
			publish = s
		}
	}
	if !publish.SpanContext.IsValid() {
		t.Fatalf("no publish span among %s", names(spans))
	}
	traceID := publish.SpanContext.TraceID()
	inTrace := map[string]tracetest.SpanStub{}
	byID := map[string]tracetest.SpanStub{}
	for _, s := range spans {
		if s.SpanContext.TraceID() == traceID {
			inTrace[s.Name] = s
			byID[s.SpanContext.SpanID().String()] = s
		}
	}
	t.Logf("trace %s: %s", traceID, names(values(inTrace)))
	// Each stage's span must descend from the publish span, through the
	// stages before it.
	chain := []string{"publish plays.events", "send plays.events", "enrich", "send plays.reports", "process plays.reports",
		"playpipe.report.deliver", "POST /partners/royalty-tracking"}
	for i := len(chain) - 1; i > 0; i-- {
		s, ok := inTrace[chain[i]]
		if !ok {
			t.Errorf("trace %s lacks span %q; it has %s", traceID, chain[i], names(values(inTrace)))
			continue
		}
		parent, ok := byID[s.Parent.SpanID().String()]
		if !ok || parent.Name != chain[i-1] {
			t.Errorf("span %q's parent is %q, want %q", chain[i], parent.Name, chain[i-1])
		}
	}
	if e, ok := inTrace["enrich"]; ok {
		hit := false
		for _, a := range e.Attributes {
			if a.Key == "playpipe.mixcache.hit" {
				hit = true
				if a.Value.AsBool() {
					t.Errorf("the first event of a mix was a mix-cache hit")
				}
			}
		}
		if !hit {
			t.Errorf("enrich span lacks playpipe.mixcache.hit: %v", e.Attributes)
		}
	}
	for _, r := range rows {
		if len(r.TraceIDs) != 1 || r.TraceIDs[0] != traceID.String() {
			t.Errorf("ClickHouse delivery of %s carries trace ids %v, want [%s]", r.ReportID, r.TraceIDs, traceID)
		}
		if r.ReportID != schemas.ReportID("trace-1", 0) && r.ReportID != schemas.ReportID("trace-1", 1) && r.ReportID != schemas.ReportID("trace-1", 2) {
			t.Errorf("unexpected report id %s", r.ReportID)
		}
	}
	// The sandbox saw the same trace on the wire.
	for _, e := range p.Sandbox.Ledger().Accepted {
		if !strings.Contains(e.TraceParent, traceID.String()) {
			t.Errorf("the partner API received traceparent %q, want trace %s", e.TraceParent, traceID)
		}
	}
}

func values(m map[string]tracetest.SpanStub) []tracetest.SpanStub {
	out := make([]tracetest.SpanStub, 0, len(m))
	for _, s := range m {
		out = append(out, s)
	}
	return out
}

func names(spans []tracetest.SpanStub) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "[%s %s parent=%s] ", s.SpanKind, s.Name, s.Parent.SpanID())
	}
	return b.String()
}
