package kafkax

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// syncBuffer is a log destination safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := strings.Split(strings.TrimSpace(s.b.String()), "\n")
	if len(out) == 1 && out[0] == "" {
		return nil
	}
	return out
}

// TestFaultLogOnceAMinute floods a FaultLog with the error a re-created
// topic gives every fetch (9 000 a second in the field): one line, then one
// line a minute later that counts the repeats.
func TestFaultLogOnceAMinute(t *testing.T) {
	var buf syncBuffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	now := time.Unix(1_700_000_000, 0)
	f := NewFaultLog(FaultLogOptions{Now: func() time.Time { return now }})
	for i := range 9000 {
		f.Fetch(log, "plays.events", int32(i%6), kerr.UnknownTopicID)
		f.Fetch(log, "plays.events", 0, context.Canceled) // not a fault
	}
	if l := buf.lines(); len(l) != 1 || !strings.Contains(l[0], "UNKNOWN_TOPIC_ID") || !strings.Contains(l[0], "fault=unknown_topic_id") {
		t.Fatalf("9000 identical fetch errors in a second gave %d lines: %q", len(l), l)
	}
	f.Fetch(log, "plays.reports", 0, kerr.UnknownTopicID) // another topic: its own line
	now = now.Add(59 * time.Second)
	f.Fetch(log, "plays.events", 1, kerr.UnknownTopicID)
	if l := buf.lines(); len(l) != 2 {
		t.Fatalf("after 59 s: %d lines, want 2: %q", len(l), l)
	}
	now = now.Add(2 * time.Second)
	f.Fetch(log, "plays.events", 2, kerr.UnknownTopicID)
	l := buf.lines()
	if len(l) != 3 || !strings.Contains(l[2], "suppressed=9000") {
		t.Fatalf("after a minute: %d lines, the last %q; want a third line with suppressed=9000", len(l), l[len(l)-1])
	}
}

func TestFetchFaultKind(t *testing.T) {
	for err, want := range map[error]string{
		kerr.UnknownTopicID:                      FaultUnknownTopicID,
		fmt.Errorf("x: %w", kerr.UnknownTopicID): FaultUnknownTopicID,
		kerr.UnknownTopicOrPartition:             FaultTopicMissing,
		kerr.NotLeaderForPartition:               FaultFetch,
	} {
		if got := FetchFaultKind(err); got != want {
			t.Errorf("%v: kind %s, want %s", err, got, want)
		}
	}
}

// startHealth runs a Health of e's brokers, probing every 50 ms.
func startHealth(t *testing.T, e *Embedded, log *slog.Logger) *Health {
	t.Helper()
	return startHealthEvery(t, e, log, 50*time.Millisecond)
}

// startHealthEvery runs a Health of e's brokers, probing every interval
// with a 300 ms timeout.
func startHealthEvery(t *testing.T, e *Embedded, log *slog.Logger, interval time.Duration) *Health {
	t.Helper()
	h, err := NewHealth(Config{Brokers: e.Addrs(), Partitions: 1}, HealthOptions{Interval: interval, Timeout: 300 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); h.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitFor(t, "the first healthy probe", 5*time.Second, func() bool { return h.Check(context.Background()) == nil })
	return h
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHealthNoticesARecreatedTopic deletes and re-creates a topic of the
// pipeline: the Health says the topic is missing, then closes Changed
// naming the topic, and Check says it.
func TestHealthNoticesARecreatedTopic(t *testing.T) {
	e, err := StartEmbedded("", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var buf syncBuffer
	h := startHealth(t, e, slog.New(slog.NewTextHandler(&buf, nil)))
	cl, err := kgo.NewClient(kgo.SeedBrokers(e.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := adm.DeleteTopics(ctx, "plays.events"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the missing topic in Check", 5*time.Second, func() bool {
		err := h.Check(ctx)
		return err != nil && strings.Contains(err.Error(), "plays.events") && strings.Contains(err.Error(), "does not exist")
	})
	select {
	case <-h.Changed():
		t.Fatal("Changed closed for a missing topic")
	default:
	}
	if _, err := adm.CreateTopics(ctx, 2, -1, nil, "plays.events"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("the re-created topic was not noticed within 5 s")
	}
	if err := h.Check(ctx); err == nil || !strings.Contains(err.Error(), "plays.events was re-created") {
		t.Fatalf("Check after the re-creation: %v", err)
	}
	if n := strings.Count(strings.Join(buf.lines(), "\n"), "came back different"); n != 1 {
		t.Errorf("the change was logged %d times, want once:\n%s", n, strings.Join(buf.lines(), "\n"))
	}
}

// TestHealthAnswersAtOnceWhenTheBrokerIsGone closes the broker: Check names
// it within a few probes and never waits on it.
func TestHealthAnswersAtOnceWhenTheBrokerIsGone(t *testing.T) {
	e, err := StartEmbedded("", 1)
	if err != nil {
		t.Fatal(err)
	}
	var buf syncBuffer
	h := startHealth(t, e, slog.New(slog.NewTextHandler(&buf, nil)))
	addr := e.Addrs()[0]
	e.Close()
	waitFor(t, "the broker's absence in Check", 5*time.Second, func() bool {
		start := time.Now()
		err := h.Check(context.Background())
		if d := time.Since(start); d > 10*time.Millisecond {
			t.Fatalf("Check took %s: it must answer from the last probe", d)
		}
		return err != nil && strings.Contains(err.Error(), addr) && strings.Contains(err.Error(), "does not answer")
	})
	time.Sleep(500 * time.Millisecond) // ~10 more failed probes
	if n := len(buf.lines()); n != 1 {
		t.Errorf("%d lines about the unreachable broker over ~10 probes, want 1:\n%s", n, strings.Join(buf.lines(), "\n"))
	}
}

// TestHealthChangedByAFetchError: a role's fetches failing with
// UNKNOWN_TOPIC_ID (its client holds an id the broker forgot) for
// UnknownTopicIDGrace close Changed; a moment of it (a topic just created)
// does not.
func TestHealthChangedByAFetchError(t *testing.T) {
	e, err := StartEmbedded("", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	var mu sync.Mutex
	now := time.Now()
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	h, err := NewHealth(Config{Brokers: e.Addrs(), Partitions: 1}, HealthOptions{Logger: slog.New(slog.DiscardHandler), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer h.cl.Close()
	quiet := slog.New(slog.DiscardHandler)
	changed := func() bool {
		select {
		case <-h.Changed():
			return true
		default:
			return false
		}
	}
	h.Faults().Fetch(quiet, "plays.reports", 0, kerr.NotLeaderForPartition)
	h.Faults().Fetch(quiet, "plays.reports", 0, kerr.UnknownTopicID)
	advance(5 * time.Second)
	h.Faults().Fetch(quiet, "plays.reports", 1, kerr.UnknownTopicID)
	if changed() {
		t.Fatal("Changed closed after 5 s of UNKNOWN_TOPIC_ID (a topic just created)")
	}
	advance(20 * time.Second) // a gap: the next error starts a new run
	h.Faults().Fetch(quiet, "plays.reports", 0, kerr.UnknownTopicID)
	advance(9 * time.Second)
	h.Faults().Fetch(quiet, "plays.reports", 0, kerr.UnknownTopicID)
	if changed() {
		t.Fatal("Changed closed 9 s into a new run of UNKNOWN_TOPIC_ID")
	}
	advance(2 * time.Second)
	h.Faults().Fetch(quiet, "plays.reports", 0, kerr.UnknownTopicID)
	if !changed() {
		t.Fatal("Changed not closed after 11 s of UNKNOWN_TOPIC_ID")
	}
	if !strings.Contains(h.ChangedBy(), "plays.reports") {
		t.Errorf("ChangedBy %q does not name the topic", h.ChangedBy())
	}
}

// TestHealthOneSlowProbeIsNotAnOutage fails one probe (a busy broker):
// the verdict stays ready; two in a row make it unready, naming the broker.
func TestHealthOneSlowProbeIsNotAnOutage(t *testing.T) {
	e, err := StartEmbedded("", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	h, err := NewHealth(Config{Brokers: e.Addrs(), Partitions: 1}, HealthOptions{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer h.cl.Close()
	real := h.metadata
	var fail bool
	h.metadata = func(ctx context.Context, req *kmsg.MetadataRequest) (*kmsg.MetadataResponse, error) {
		if fail {
			return nil, context.DeadlineExceeded
		}
		return real(ctx, req)
	}
	ctx := context.Background()
	h.probe(ctx)
	if err := h.Check(ctx); err != nil {
		t.Fatalf("after an answered probe: %v", err)
	}
	fail = true
	h.probe(ctx)
	if err := h.Check(ctx); err != nil {
		t.Fatalf("one failed probe made the broker unready: %v", err)
	}
	h.probe(ctx)
	if err := h.Check(ctx); err == nil || !strings.Contains(err.Error(), e.Addrs()[0]) {
		t.Fatalf("after two failed probes in a row: %v, want an error naming the broker", err)
	}
	fail = false
	h.probe(ctx)
	if err := h.Check(ctx); err != nil {
		t.Fatalf("after the broker answered again: %v", err)
	}
}

// TestHealthWritesBelowMinISR: a topic the role writes with a partition
// below min.insync.replicas (two of three brokers down: its writes with
// acks=all fail with NOT_ENOUGH_REPLICAS) or without a leader makes the
// role not ready, naming the topic and the partition; a role that writes
// no topic (the sink) stays ready; the brokers back, ready again.
func TestHealthWritesBelowMinISR(t *testing.T) {
	e, err := StartEmbedded("", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	topics := TopicsFor("")
	newHealth := func(writes []string) (*Health, *int) {
		h, err := NewHealth(Config{Brokers: e.Addrs(), Partitions: 1}, HealthOptions{Logger: slog.New(slog.DiscardHandler), Writes: writes})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(h.cl.Close)
		real := h.metadata
		isr := new(int) // in-sync replicas of every partition, of 3; -1: no leader
		*isr = 3
		h.metadata = func(ctx context.Context, req *kmsg.MetadataRequest) (*kmsg.MetadataResponse, error) {
			resp, err := real(ctx, req)
			if err != nil {
				return nil, err
			}
			for i := range resp.Topics {
				for j := range resp.Topics[i].Partitions {
					p := &resp.Topics[i].Partitions[j]
					p.Replicas = []int32{1, 2, 3}
					p.ISR = p.Replicas[:max(*isr, 0)]
					if *isr < 0 {
						p.Leader = -1
					}
				}
			}
			return resp, nil
		}
		h.describe = func(_ context.Context, req *kmsg.DescribeConfigsRequest) (*kmsg.DescribeConfigsResponse, error) {
			resp := kmsg.NewPtrDescribeConfigsResponse()
			for _, r := range req.Resources {
				rr := kmsg.NewDescribeConfigsResponseResource()
				rr.ResourceType, rr.ResourceName = r.ResourceType, r.ResourceName
				c := kmsg.NewDescribeConfigsResponseResourceConfig()
				c.Name, c.Value = "min.insync.replicas", kmsg.StringPtr("2")
				rr.Configs = append(rr.Configs, c)
				resp.Resources = append(resp.Resources, rr)
			}
			return resp, nil
		}
		return h, isr
	}
	ctx := context.Background()
	// The embedded broker as it answers (every replica in sync, its own
	// min.insync.replicas): ready.
	plain, err := NewHealth(Config{Brokers: e.Addrs(), Partitions: 1}, HealthOptions{Logger: slog.New(slog.DiscardHandler), Writes: topics.All()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(plain.cl.Close)
	plain.probe(ctx)
	if err := plain.Check(ctx); err != nil {
		t.Errorf("the embedded broker, every topic written: %v, want ready", err)
	}
	report, isr := newHealth([]string{topics.Deliveries, topics.Parked})
	sink, sinkISR := newHealth(nil)
	for _, tc := range []struct {
		isr   int
		ready bool
		says  string
	}{{3, true, ""}, {2, true, ""}, {1, false, "1 in-sync of 3 replicas"}, {-1, false, "no leader"}, {3, true, ""}} {
		*isr, *sinkISR = tc.isr, tc.isr
		report.probe(ctx)
		sink.probe(ctx)
		err := report.Check(ctx)
		switch {
		case tc.ready && err != nil:
			t.Errorf("%d in-sync replicas of 3, min 2: %v, want ready", tc.isr, err)
		case !tc.ready && (err == nil || !strings.Contains(err.Error(), "NOT_ENOUGH_REPLICAS") || !strings.Contains(err.Error(), topics.Deliveries+" partitions 0 ("+tc.says)):
			t.Errorf("in-sync replicas %d of 3, min 2: %v, want not ready naming %s partition 0 (%s)", tc.isr, err, topics.Deliveries, tc.says)
		}
		if err := sink.Check(ctx); err != nil {
			t.Errorf("a role that writes no topic, in-sync replicas %d: %v, want ready", tc.isr, err)
		}
	}
}
