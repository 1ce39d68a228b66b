package consumer

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// fakeMixes are listings with the awkward shapes: unsorted and duplicate
// times, a first track after 0, isrcs with odd bytes, no isrc.
func fakeMixes() []partnerapi.Mix {
	mixes := []partnerapi.Mix{testMix(),
		{ID: 43, Title: "unsorted", Length: "00:10:00", Tracks: []partnerapi.Track{
			{ID: 13, Time: "00:07:30", ISRC: "C"}, {ID: 11, Time: "00:00:00", ISRC: "A"},
			{ID: 12, Time: "00:03:00", ISRC: "B"}, {ID: 14, Time: "00:03:00", ISRC: "D"}}},
		{ID: 44, Title: "late start", Length: "00:05:00", Tracks: []partnerapi.Track{
			{ID: 21, Time: "00:00:30", ISRC: "X"}, {ID: 22, Time: "00:02:00", ISRC: "Y\u2028<&>"}}},
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for id := int64(50); id < 60; id++ {
		m := partnerapi.Mix{ID: id, Title: fmt.Sprintf("Mix %d \"live\"", id), Length: "01:00:00"}
		at := 0
		for k := 0; k < 15; k++ {
			m.Tracks = append(m.Tracks, partnerapi.Track{ID: id*100 + int64(k), Time: fmt.Sprintf("%02d:%02d:%02d", at/3600, at/60%60, at%60),
				ISRC: fmt.Sprintf("QZ%03dK%07d", id, k)})
			at += rng.IntN(400)
		}
		mixes = append(mixes, m)
	}
	return mixes
}

func refMixes(ms []partnerapi.Mix) []refMix {
	out := make([]refMix, len(ms))
	for i, m := range ms {
		out[i] = refFromMix(m)
	}
	return out
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// runEnricher starts e.Run in a goroutine; the returned stop cancels it and
// returns Run's error.
func runEnricher(t *testing.T, e *Enricher) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- e.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-errc:
			case <-time.After(30 * time.Second):
				err = fmt.Errorf("Run did not return within 30s of cancel")
			}
		})
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func newTestEnricher(t *testing.T, k *testenv.Kafka, src MixSource, mod func(*Config)) *Enricher {
	t.Helper()
	o := Config{Kafka: k.Config, Source: src, TransactionalID: "enrich-test-" + t.Name(), Logger: quietLogger(),
		CacheConfig: fastRetry(CacheConfig{})}
	if mod != nil {
		mod(&o)
	}
	e, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestEnricherExactOutputOverKafka(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 3)
	mixes := fakeMixes()
	src := newFakeSource(mixes...)
	evs := genEvents(1, 3000, refMixes(mixes), 999_999)
	publish(t, k, k.Config.Topics().Events, evs)

	e := newTestEnricher(t, k, src, nil)
	stop := runEnricher(t, e)
	waitFor(t, 30*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(evs)) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := e.Stats()
	if st.Events != int64(len(evs)) {
		t.Fatalf("committed %d events, want %d", st.Events, len(evs))
	}
	for _, m := range mixes {
		if n := src.callsOf(m.ID); n != 1 {
			t.Errorf("mix %d fetched %d times, want once", m.ID, n)
		}
	}
	if n := src.callsOf(999_999); n != 1 {
		t.Errorf("unknown mix fetched %d times, want once (negative cache)", n)
	}
	t.Logf("stats %+v, cache %+v", st, e.Cache().Stats())
	checkOutput(t, k, evs)
}

func TestEnricherKillAndRestartNoLossNoDuplicate(t *testing.T) {
	t.Parallel()
	// The replacement either reuses the dead instance's transactional id (a
	// restarted pod: the dangling transaction is fenced at once) or has its
	// own (another pod: it waits until the broker times the dangling
	// transaction out, as its pending offsets are unstable until then).
	t.Run("same transactional id", func(t *testing.T) { t.Parallel(); testKillAndRestart(t, "enrich-restart", 60*time.Second) })
	t.Run("new transactional id", func(t *testing.T) { t.Parallel(); testKillAndRestart(t, "enrich-other-pod", 3*time.Second) })
}

func testKillAndRestart(t *testing.T, replacementID string, killedTxnTimeout time.Duration) {
	k := testenv.StartKafka(t, 3)
	mixes := fakeMixes()
	evs := genEvents(2, 4000, refMixes(mixes), 999_999)
	publish(t, k, k.Config.Topics().Events, evs)

	// A slow first instance with small transactions, killed mid-stream.
	slow := newFakeSource(mixes...)
	a := newTestEnricher(t, k, slow, func(o *Config) {
		o.TransactionalID = "enrich-restart"
		o.TransactionTimeout = killedTxnTimeout
		o.MaxTxnWait = killedTxnTimeout / 2
		o.TxnRecords = 100
		o.TxnInterval = 20 * time.Millisecond
		// Listings expire at once, so every event waits ~1ms for a fetch.
		o.Cache, _ = NewMixCache(slowHits{slow}, CacheConfig{TTL: time.Nanosecond})
	})
	// Kill it once it has committed some and has records of an open
	// transaction on the broker: no End, no clean leave.
	killed := make(chan struct{})
	a.testHookProduced = func(cl *kgo.Client) {
		if a.Stats().Events < 1000 || isClosed(killed) {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if cl.Flush(ctx) == nil { // the open transaction's records are on the broker
			close(killed)
			a.crash()
		}
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	defer cancelA()
	errA := make(chan error, 1)
	go func() { errA <- a.Run(ctxA) }()
	select {
	case <-killed:
	case <-time.After(30 * time.Second):
		t.Fatal("the first instance never reached the kill point")
	}
	killedAt := time.Now()
	select {
	case err := <-errA:
		t.Logf("killed instance returned: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("killed instance did not return")
	}
	doneA := a.Stats()
	if doneA.Events >= int64(len(evs)) {
		t.Fatalf("the first instance finished everything (%d) before the kill; the test proves nothing", doneA.Events)
	}

	// The replacement: same group, same transactional id (a restarted pod).
	b := newTestEnricher(t, k, newFakeSource(mixes...), func(o *Config) { o.TransactionalID = replacementID })
	stop := runEnricher(t, b)
	waitGroupDone(t, k, DefaultGroup, 40*time.Second)
	if replacementID != "enrich-restart" {
		// Read-committed readers see nothing past the dangling transaction
		// until the broker aborts it at its timeout.
		time.Sleep(time.Until(killedAt.Add(killedTxnTimeout + time.Second)))
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The first instance may have died after its last commit reached the
	// broker but before it learnt so; its count is then short, never long.
	if total := doneA.Events + b.Stats().Events; total > int64(len(evs)) {
		t.Errorf("events committed: %d before the kill + %d after = %d > %d: something was processed twice", doneA.Events, b.Stats().Events, total, len(evs))
	}
	t.Logf("before kill %+v; after %+v", doneA, b.Stats())
	checkOutput(t, k, evs)
	// The log itself holds more: the killed instance's dangling transaction
	// was aborted, and read_committed readers never see it.
	raw := len(k.ReadAllUncommitted(t, k.Config.Topics().Reports))
	committed := len(k.ReadAll(t, k.Config.Topics().Reports))
	t.Logf("reports in the log: %d (read_uncommitted) vs %d committed", raw, committed)
	if raw <= committed {
		t.Errorf("no aborted records in the log (%d ≤ %d): the kill did not interrupt a transaction", raw, committed)
	}
}

// slowHits slows every fetch slightly so the first instance of the
// kill test is still mid-stream when it is killed.
type slowHits struct{ src MixSource }

func (s slowHits) Mix(ctx context.Context, id int64) (partnerapi.Mix, partnerapi.Meta, error) {
	time.Sleep(time.Millisecond) // the latency of each fetch (scenario), not synchronisation
	return s.src.Mix(ctx, id)
}

// TestEnricher503StormNothingRejected: a 503 storm on one mix while a
// transaction is open holds that mix's events (and later ones of their
// keys), rejects nothing, and every event is derived exactly once.
func TestEnricher503StormNothingRejected(t *testing.T) {
	k := testenv.StartKafka(t, 3)
	mixes := fakeMixes()
	src := newFakeSource(mixes...)
	storm := &stormSource{fakeSource: src, stormID: 44, length: 1200 * time.Millisecond}
	calm := refMixes(mixes)
	calm = append(calm[:2:2], calm[3:]...) // every mix but 44
	phase1 := genEvents(3, 1500, calm, 999_999)
	phase2 := genEvents(4, 1500, refMixes(mixes), 999_999)

	e := newTestEnricher(t, k, storm, func(o *Config) {
		o.TxnRecords = 100_000
		o.TxnInterval = 2 * time.Second
		o.MaxTxnWait = 200 * time.Millisecond
	})
	// Phase 1 is produced in an open transaction before phase 2 (and its
	// storm) is published: the hook tells when a batch was produced.
	var produced atomic.Int64
	e.testHookProduced = func(*kgo.Client) { produced.Add(1) }
	stop := runEnricher(t, e)
	publish(t, k, k.Config.Topics().Events, phase1)
	waitFor(t, 20*time.Second, "phase 1 produced in an open transaction", func() bool { return produced.Load() > 0 })
	publish(t, k, k.Config.Topics().Events, phase2)
	all := append(phase1, phase2...)
	waitFor(t, 40*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(all)) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	st := e.Stats()
	if st.Events != int64(len(all)) {
		t.Fatalf("committed %d events, want %d", st.Events, len(all))
	}
	if storm.failed() == 0 {
		t.Fatal("the storm never hit")
	}
	// The storming mix's events were held (not waited for inside the
	// transaction, not rejected) and released once it was served.
	if st.HeldPeak == 0 || st.Released < st.HeldPeak || st.Held != 0 {
		t.Errorf("hold not exercised: %+v", st)
	}
	t.Logf("storm failures %d, stats %+v, cache %+v", storm.failed(), st, e.Cache().Stats())
	checkOutput(t, k, all)
}

// stormSource answers 503 for stormID during length after its first request.
type stormSource struct {
	*fakeSource
	stormID int64
	length  time.Duration
	mu      sync.Mutex
	first   time.Time
	fails   int
}

func (s *stormSource) Mix(ctx context.Context, id int64) (partnerapi.Mix, partnerapi.Meta, error) {
	if id == s.stormID {
		s.mu.Lock()
		if s.first.IsZero() {
			s.first = time.Now()
		}
		storming := time.Since(s.first) < s.length
		if storming {
			s.fails++
		}
		s.mu.Unlock()
		if storming {
			return partnerapi.Mix{}, partnerapi.Meta{}, &partnerapi.Error{Kind: partnerapi.KindTransient, Op: "GET /partners/mix", Status: 503}
		}
	}
	return s.fakeSource.Mix(ctx, id)
}

func (s *stormSource) failed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fails
}

func TestOptionsValidate(t *testing.T) {
	k := testenv.StartKafka(t, 1)
	for _, tc := range []struct {
		name string
		mod  func(*Config)
	}{
		{"no brokers", func(o *Config) { o.Kafka.Brokers = nil }},
		{"no source", func(o *Config) { o.Source = nil }},
		{"negative txn records", func(o *Config) { o.TxnRecords = -1 }},
		{"wait over half the txn timeout", func(o *Config) { o.MaxTxnWait = 40 * time.Second; o.TransactionTimeout = 60 * time.Second }},
		{"bad cache size", func(o *Config) { o.CacheConfig.Size = -5 }},
	} {
		o := Config{Kafka: k.Config, Source: newFakeSource()}
		tc.mod(&o)
		if _, err := New(o); err == nil {
			t.Errorf("%s: accepted", tc.name)
		} else {
			t.Logf("%s: %v", tc.name, err)
		}
	}
}

// waitGroupDone waits until group's committed offsets on the events topic
// reach the end of every partition (stable: no transaction pending).
func waitGroupDone(t *testing.T, k *testenv.Kafka, group string, d time.Duration) {
	t.Helper()
	adm := kadm.NewClient(k.Client(t))
	topic := k.Config.Topics().Events
	waitFor(t, d, "group "+group+" to commit to the end of "+topic, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return false
		}
		committed, err := adm.FetchOffsets(ctx, group)
		if err != nil || committed.Error() != nil {
			return false
		}
		done := true
		ends.Each(func(o kadm.ListedOffset) {
			c, ok := committed.Lookup(o.Topic, o.Partition)
			if o.Offset > 0 && (!ok || c.At < o.Offset || errors.Is(c.Err, context.Canceled)) {
				done = false
			}
		})
		return done
	})
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

func TestEnricherStopsOnEdgeBlock(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 1)
	src := newFakeSource(fakeMixes()...)
	src.byID[42] = true
	src.failErr = &partnerapi.Error{Kind: partnerapi.KindEdgeBlocked, Status: 403, Reason: "error code: 1010"}
	publish(t, k, k.Config.Topics().Events, genEvents(8, 50, refMixes(fakeMixes()[:1]), 999_999))
	e := newTestEnricher(t, k, src, nil)
	errc := make(chan error, 1)
	go func() { errc <- e.Run(context.Background()) }()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Run returned %v, want ErrInvalidConfig", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not stop on an edge block")
	}
	if st := e.Stats(); st.Events != 0 || st.Commits != 0 {
		t.Fatalf("committed work despite the configuration error: %+v", st)
	}
	if n := len(k.ReadAll(t, k.Config.Topics().Rejected)); n != 0 {
		t.Fatalf("%d rejections written", n)
	}
}
