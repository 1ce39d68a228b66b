package analytics

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

type env struct {
	kafka  *testenv.Kafka
	ch     *testenv.ClickHouse
	topics kafkax.Topics
	prod   *kgo.Client
	cfg    SinkConfig
}

func newEnv(t testing.TB) *env {
	t.Helper()
	k := testenv.StartKafka(t, 3)
	ch := testenv.StartClickHouse(t)
	e := &env{kafka: k, ch: ch, topics: k.Config.Topics()}
	e.prod = k.Client(t, kgo.ProducerLinger(0))
	e.cfg = SinkConfig{
		Kafka:      k.Config,
		ClickHouse: Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password},
		BatchRows:  200,
		Linger:     50 * time.Millisecond,
		RetryMin:   50 * time.Millisecond,
		RetryMax:   400 * time.Millisecond,
		Logger:     testLogger(),
	}
	return e
}

func testLogger() *slog.Logger {
	level := slog.LevelWarn
	if os.Getenv("PLAYPIPE_TEST_VERBOSE") != "" {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
}

func (e *env) produce(t testing.TB, recs ...*kgo.Record) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := e.prod.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatalf("produce: %v", err)
	}
}

// running is a sink started in the background.
type running struct {
	sink   *Sink
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
	err    error
}

func (e *env) startSink(t *testing.T, cfg SinkConfig) *running {
	t.Helper()
	s, err := NewSink(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1), sink: s}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels the sink and waits for Run to return; it returns Run's error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case r.err = <-r.done:
		case <-time.After(30 * time.Second):
			t.Fatal("sink did not stop within 30 s")
		}
	})
	return r.err
}

func (e *env) auditor(t *testing.T) *Auditor {
	t.Helper()
	a, err := NewAuditor(e.ch.Conn(t), e.ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// waitFor polls cond until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func eventJSON(t testing.TB, id string, userID string) []byte {
	vendor := int64(7)
	return mustJSON(t, schemas.PlayerEvent{EventID: id, MixID: 42, StartedAt: 1_700_000_000_000, OffsetMS: 0, DurationMS: 600_000,
		UserID: userID, Country: "DE", OS: "android", Device: "phone", Vendor: &vendor})
}

func playJSON(t testing.TB, eventID string, pos int, below bool) (string, []byte) {
	return playJSONAt(t, eventID, pos, below, 0)
}

// playJSONAt is playJSON carrying eventAt, the event record's time
// (TrackPlay.EventAt; 0 leaves it out).
func playJSONAt(t testing.TB, eventID string, pos int, below bool, eventAt int64) (string, []byte) {
	id := schemas.ReportID(eventID, pos)
	return id, mustJSON(t, schemas.TrackPlay{V: schemas.TrackPlayVersion, ReportID: id, EventID: eventID, MixID: 42, Position: pos,
		OverlapMS: 200_000, BelowMinimum: below, DerivedAt: 1_700_000_000_500, EventAt: eventAt,
		Report: schemas.PlayReport{TrackID: int64(1000 + pos), PlayedAt: 1_700_000_000_000, PlayLength: 200, SourceStream: "mix",
			SourceDetail: "Mix 42", OS: "android", Device: "phone", Country: "DE", Vendor: 7, UserID: "u1", ISRC: "DEX123456789"}})
}

func deliveryJSON(t testing.TB, reportID, eventID, outcome string, attempt int, at int64, traceID, msg string) []byte {
	d := schemas.Delivery{V: schemas.DeliveryVersion, ReportID: reportID, EventID: eventID, Outcome: outcome, Attempt: attempt,
		HTTPStatus: 200, Message: msg, LatencyUS: 1500, TraceID: traceID, At: at}
	switch outcome {
	case schemas.OutcomeStandby:
		d.ServedBy = "standby"
	case schemas.OutcomeRejected:
		d.HTTPStatus = 400
	case schemas.OutcomeRetry:
		d.HTTPStatus, d.Reason = 503, "http_503"
	}
	return mustJSON(t, d)
}

var errCrash = errors.New("simulated crash between insert and commit")

func testKafkaConfig() kafkax.Config {
	return kafkax.Config{Brokers: []string{"127.0.0.1:9092"}, TopicPrefix: "plays", Partitions: 3}
}

// migratedClickHouse starts a ClickHouse server for the test and migrates
// its ledger database.
func migratedClickHouse(t *testing.T) (*testenv.ClickHouse, driver.Conn) {
	t.Helper()
	ch := testenv.StartClickHouse(t)
	conn := ch.Conn(t)
	if _, err := Migrate(context.Background(), conn, ch.Database); err != nil {
		t.Fatal(err)
	}
	return ch, conn
}
