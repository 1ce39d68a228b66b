package consumer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/stacks"
	"github.com/playpipe/playpipe/partnerapi"
)

// fakeSource is a MixSource for unit tests: mixes by id, 404 for others,
// with injectable transient failures and latency.
type fakeSource struct {
	mu       sync.Mutex
	mixes    map[int64]partnerapi.Mix
	standby  bool
	failNext int            // transient failures still to inject (all ids)
	failErr  error          // the error injected; a 503 by default
	calls    map[int64]int  // calls per id
	delay    time.Duration  // latency of each call
	inflight atomic.Int32   // calls running now
	maxIn    atomic.Int32   // most calls running at once
	gate     chan struct{}  // when set, calls wait for it to close
	byID     map[int64]bool // ids whose calls fail transiently forever
}

func newFakeSource(mixes ...partnerapi.Mix) *fakeSource {
	f := &fakeSource{mixes: map[int64]partnerapi.Mix{}, calls: map[int64]int{}, byID: map[int64]bool{}}
	for _, m := range mixes {
		f.mixes[m.ID] = m
	}
	return f
}

func (f *fakeSource) Mix(ctx context.Context, id int64) (partnerapi.Mix, partnerapi.Meta, error) {
	n := f.inflight.Add(1)
	defer f.inflight.Add(-1)
	for {
		m := f.maxIn.Load()
		if n <= m || f.maxIn.CompareAndSwap(m, n) {
			break
		}
	}
	f.mu.Lock()
	f.calls[id]++
	gate, delay := f.gate, f.delay
	f.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return partnerapi.Mix{}, partnerapi.Meta{}, ctx.Err()
		}
	}
	if delay > 0 {
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return partnerapi.Mix{}, partnerapi.Meta{}, ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	op := fmt.Sprintf("GET /partners/mix/%d", id)
	if f.failNext > 0 || f.byID[id] {
		if !f.byID[id] {
			f.failNext--
		}
		if f.failErr != nil {
			return partnerapi.Mix{}, partnerapi.Meta{}, f.failErr
		}
		return partnerapi.Mix{}, partnerapi.Meta{}, &partnerapi.Error{Kind: partnerapi.KindTransient, Op: op, Status: 503}
	}
	m, ok := f.mixes[id]
	if !ok {
		return partnerapi.Mix{}, partnerapi.Meta{}, &partnerapi.Error{Kind: partnerapi.KindNotFound, Op: op, Status: 404, Reason: "Mix not found"}
	}
	meta := partnerapi.Meta{Status: 200}
	if f.standby {
		meta.ServedBy = partnerapi.ServedStandby
	}
	return m, meta, nil
}

func (f *fakeSource) callsOf(id int64) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[id]
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func fastRetry(o CacheConfig) CacheConfig {
	o.RetryMin, o.RetryMax = time.Millisecond, 5*time.Millisecond
	o.Logger = quietLogger()
	return o
}

func TestMixCacheSingleFlight(t *testing.T) {
	src := newFakeSource(testMix())
	src.gate = make(chan struct{})
	c, err := NewMixCache(src, CacheConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	results := make([]*Listing, 50)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.Get(ctx, 42)
			if err != nil {
				t.Error(err)
			}
			results[i] = l
		}()
	}
	// Let all of them queue up behind the one fetch (the leader waits in
	// the source for the gate, 49 in Get for its flight), then release it.
	waitFor(t, 5*time.Second, "50 Gets blocked behind one fetch", func() bool {
		return src.callsOf(42) == 1 && stacks.BlockedIn("consumer.(*MixCache).Get(") == 50
	})
	src.mu.Lock()
	close(src.gate)
	src.gate = nil
	src.mu.Unlock()
	wg.Wait()
	if n := src.callsOf(42); n != 1 {
		t.Fatalf("50 concurrent Gets made %d fetches, want 1", n)
	}
	for _, l := range results {
		if l == nil || l != results[0] || l.Title != testMix().Title {
			t.Fatalf("waiters got different listings")
		}
	}
	if l, err := c.Lookup(42); l == nil || err != nil {
		t.Fatalf("Lookup after Get: %v %v", l, err)
	}
	if s := c.Stats(); s.Fetches != 1 || s.Hits < 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMixCacheTTLAndStandby(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	src := newFakeSource(testMix())
	c, _ := NewMixCache(src, CacheConfig{TTL: time.Minute, StandbyTTL: 5 * time.Second, Now: clock.Now})
	ctx := context.Background()
	mustGet := func() *Listing {
		t.Helper()
		l, err := c.Get(ctx, 42)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	mustGet()
	clock.Advance(59 * time.Second)
	mustGet()
	if n := src.callsOf(42); n != 1 {
		t.Fatalf("within TTL: %d fetches", n)
	}
	clock.Advance(2 * time.Second)
	mustGet()
	if n := src.callsOf(42); n != 2 {
		t.Fatalf("after TTL: %d fetches, want 2", n)
	}
	// Standby-served data lives StandbyTTL only, and is marked.
	src.standby = true
	clock.Advance(61 * time.Second)
	if l := mustGet(); !l.Standby {
		t.Fatal("standby listing not marked")
	}
	clock.Advance(4 * time.Second)
	mustGet()
	if n := src.callsOf(42); n != 3 {
		t.Fatalf("within standby TTL: %d fetches, want 3", n)
	}
	clock.Advance(2 * time.Second)
	src.standby = false
	if l := mustGet(); l.Standby {
		t.Fatal("live listing after standby still marked standby")
	}
	if n := src.callsOf(42); n != 4 {
		t.Fatalf("after standby TTL: %d fetches, want 4", n)
	}
}

func TestMixCacheNotFound(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	src := newFakeSource()
	c, _ := NewMixCache(src, CacheConfig{NotFoundTTL: 10 * time.Second, Now: clock.Now})
	for i := 0; i < 5; i++ {
		if _, err := c.Get(context.Background(), 7); !errors.Is(err, ErrUnknownMix) {
			t.Fatalf("want ErrUnknownMix, got %v", err)
		}
	}
	if n := src.callsOf(7); n != 1 {
		t.Fatalf("404 not negative-cached: %d fetches", n)
	}
	if _, err := c.Lookup(7); !errors.Is(err, ErrUnknownMix) {
		t.Fatalf("Lookup: %v", err)
	}
	clock.Advance(11 * time.Second)
	src.mixes[7] = partnerapi.Mix{ID: 7, Length: "00:01:00"}
	if l, err := c.Get(context.Background(), 7); err != nil || l == nil {
		t.Fatalf("after the negative TTL the mix is fetched again: %v", err)
	}
}

func TestMixCacheTransientRetriedNeverRejected(t *testing.T) {
	src := newFakeSource(testMix())
	src.failNext = 5
	c, _ := NewMixCache(src, fastRetry(CacheConfig{}))
	l, err := c.Get(context.Background(), 42)
	if err != nil || l == nil {
		t.Fatalf("after 5 transient failures: %v", err)
	}
	if n := src.callsOf(42); n != 6 {
		t.Fatalf("%d calls, want 6", n)
	}
	// Other failure kinds that are not 404 or edge-blocked are retried too.
	for _, e := range []error{
		&partnerapi.Error{Kind: partnerapi.KindUnauthorized, Status: 401},
		&partnerapi.Error{Kind: partnerapi.KindRejected, Status: 400},
		errors.New("decode: unexpected EOF"),
	} {
		src2 := newFakeSource(testMix())
		src2.failNext, src2.failErr = 2, e
		c2, _ := NewMixCache(src2, fastRetry(CacheConfig{}))
		if _, err := c2.Get(context.Background(), 42); err != nil {
			t.Fatalf("%v: %v", e, err)
		}
	}
	// A storm that outlasts ctx ends with ctx's error, never ErrUnknownMix.
	src.byID[99] = true
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Get(ctx, 99); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("storm: want deadline exceeded, got %v", err)
	}
	// Edge-blocked is a configuration error.
	src3 := newFakeSource(testMix())
	src3.failNext, src3.failErr = 1, &partnerapi.Error{Kind: partnerapi.KindEdgeBlocked, Status: 403}
	c3, _ := NewMixCache(src3, fastRetry(CacheConfig{}))
	if _, err := c3.Get(context.Background(), 42); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, partnerapi.ErrEdgeBlocked) {
		t.Fatalf("edge blocked: %v", err)
	}
}

func TestMixCacheServesStaleOnTransientRefreshFailure(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	src := newFakeSource(testMix())
	c, _ := NewMixCache(src, fastRetry(CacheConfig{TTL: time.Minute, Now: clock.Now}))
	first, _ := c.Get(context.Background(), 42)
	clock.Advance(2 * time.Minute)
	src.byID[42] = true
	l, err := c.Get(context.Background(), 42)
	if err != nil || l != first {
		t.Fatalf("stale listing not served: %v", err)
	}
	if s := c.Stats(); s.StaleServed != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestMixCacheBounded(t *testing.T) {
	src := newFakeSource()
	for id := int64(1); id <= 10; id++ {
		src.mixes[id] = partnerapi.Mix{ID: id, Length: "00:01:00"}
	}
	c, _ := NewMixCache(src, CacheConfig{Size: 3})
	ctx := context.Background()
	for id := int64(1); id <= 10; id++ {
		if _, err := c.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
		c.Get(ctx, 1) // keep 1 recently used
	}
	if s := c.Stats(); s.Entries != 3 {
		t.Fatalf("entries %d, want 3", s.Entries)
	}
	if l, _ := c.Lookup(1); l == nil {
		t.Fatal("the most recently used mix was evicted")
	}
	if l, _ := c.Lookup(2); l != nil {
		t.Fatal("least recently used mix 2 still cached")
	}
	if l, _ := c.Lookup(10); l == nil {
		t.Fatal("newest mix evicted")
	}
}

func TestCacheOptionsValidate(t *testing.T) {
	if _, err := NewMixCache(newFakeSource(), CacheConfig{Size: -1}); err == nil {
		t.Fatal("negative size accepted")
	}
	if _, err := NewMixCache(newFakeSource(), CacheConfig{RetryMin: time.Second, RetryMax: time.Millisecond}); err == nil {
		t.Fatal("min > max accepted")
	}
	if _, err := NewMixCache(nil, CacheConfig{}); err == nil {
		t.Fatal("nil source accepted")
	}
}

// TestMixUnavailablePolicy: a mix answered 400 (or a 200 that does not
// decode) is retried until it has failed so UnavailableAttempts times over
// UnavailableAfter, then declared unavailable (and remembered); a 503 is
// retried for as long as the caller waits; refused credentials stop at once.
func TestMixUnavailablePolicy(t *testing.T) {
	var ticks atomic.Int64
	clock := func() time.Time { // every reading moves the clock 100ms on
		return time.Unix(1_700_000_000, 0).Add(time.Duration(ticks.Add(1)) * 100 * time.Millisecond)
	}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"400", &partnerapi.Error{Kind: partnerapi.KindRejected, Op: "GET /partners/mix/7", Status: 400, Reason: "bad request"}},
		{"undecodable 200", &partnerapi.Error{Kind: partnerapi.KindTransient, Op: "GET /partners/mix/7", Status: 200, Reason: "malformed response body"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := newFakeSource()
			src.byID[7], src.failErr = true, tc.err
			c, err := NewMixCache(src, CacheConfig{UnavailableAttempts: 4, UnavailableAfter: time.Second,
				RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond, Now: clock, Logger: quietLogger()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = c.Get(ctx, 7)
			if !errors.Is(err, ErrMixUnavailable) {
				t.Fatalf("Get: %v, want ErrMixUnavailable", err)
			}
			src.mu.Lock()
			calls := src.calls[7]
			src.mu.Unlock()
			// 4 answers are not enough while under 1s of (fake) time has
			// passed: each fetch reads the clock about twice.
			if calls < 4 {
				t.Errorf("declared unavailable after %d answers, policy says at least 4", calls)
			}
			if _, err := c.Lookup(7); !errors.Is(err, ErrMixUnavailable) {
				t.Errorf("verdict not remembered: Lookup %v", err)
			}
			if c.Stats().Unavailable != 1 {
				t.Errorf("stats %+v", c.Stats())
			}
		})
	}
	t.Run("503 never", func(t *testing.T) {
		src := newFakeSource()
		src.byID[8] = true // 503 for ever
		c, err := NewMixCache(src, CacheConfig{UnavailableAttempts: 1, UnavailableAfter: 0,
			RetryMin: time.Millisecond, RetryMax: 2 * time.Millisecond, Now: clock, Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		if _, err := c.Get(ctx, 8); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get: %v, want the caller's deadline (503s are retried, never a verdict)", err)
		}
	})
	t.Run("refused credentials", func(t *testing.T) {
		src := newFakeSource()
		src.byID[9], src.failErr = true, &partnerapi.Error{Kind: partnerapi.KindUnauthorized, Endpoint: partnerapi.EndpointSession, Op: "POST /partners/session", Status: 401, Reason: "invalid client_signature"}
		c, err := NewMixCache(src, CacheConfig{Logger: quietLogger()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Get(context.Background(), 9); !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("Get: %v, want ErrInvalidConfig", err)
		}
	})
	t.Run("refused credentials, decided by the endpoint", func(t *testing.T) {
		if !refusedCredentials(&partnerapi.Error{Kind: partnerapi.KindRejected, Endpoint: partnerapi.EndpointSessionWithUser, Op: "session", Status: 400}) {
			t.Error("a session endpoint's 400 named otherwise is not taken for refused credentials")
		}
		if refusedCredentials(&partnerapi.Error{Kind: partnerapi.KindRejected, Endpoint: partnerapi.EndpointMix, Op: "POST /partners/session?", Status: 400}) {
			t.Error("a mix endpoint's 400 is taken for refused credentials by its Op")
		}
	})
}
