package consumer

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/playpipe/playpipe/internal/backoff"
	"github.com/playpipe/playpipe/partnerapi"
)

// MixSource serves mixes by id; *partnerapi.Client satisfies it. Errors are
// classified with partnerapi.KindOf.
type MixSource interface {
	Mix(ctx context.Context, id int64) (partnerapi.Mix, partnerapi.Meta, error)
}

// ErrUnknownMix is returned by MixCache for a mix the partner API answered
// 404 for: events of it are rejected as unknown_mix.
var ErrUnknownMix = errors.New("consumer: mix unknown to the partner API")

// ErrMisconfigured wraps a partner API failure that no retry fixes (the edge
// blocked our User-Agent): the enricher stops and says so.
var ErrMisconfigured = errors.New("consumer: partner API refuses this client (configuration error)")

// CacheOptions configure a MixCache. Zero fields take the stated defaults.
type CacheOptions struct {
	// Size is the most listings kept (least recently used evicted first);
	// defaults to 10000.
	Size int
	// TTL is how long a listing served by live service is used; defaults to 10m.
	TTL time.Duration
	// StandbyTTL is how long a listing served by the standby layer is used
	// (its metadata may be degraded); defaults to 30s.
	StandbyTTL time.Duration
	// NotFoundTTL is how long a 404 is remembered; defaults to 30s.
	NotFoundTTL time.Duration
	// RetryMin and RetryMax bound the exponential backoff (with jitter)
	// between fetches after a transient failure; default 100ms and 5s. A
	// server's Retry-After is honoured up to RetryMax.
	RetryMin, RetryMax time.Duration
	// Logger receives retry warnings; defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock; defaults to time.Now (tests set it).
	Now func() time.Time
}

func (o *CacheOptions) setDefaults() {
	if o.Size == 0 {
		o.Size = 10000
	}
	if o.TTL == 0 {
		o.TTL = 10 * time.Minute
	}
	if o.StandbyTTL == 0 {
		o.StandbyTTL = 30 * time.Second
	}
	if o.NotFoundTTL == 0 {
		o.NotFoundTTL = 30 * time.Second
	}
	if o.RetryMin == 0 {
		o.RetryMin = 100 * time.Millisecond
	}
	if o.RetryMax == 0 {
		o.RetryMax = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks the options once; errors name the flag.
func (o CacheOptions) Validate() error {
	switch {
	case o.Size < 0:
		return fmt.Errorf("consumer: --mix-cache-size must be ≥ 1, got %d", o.Size)
	case o.TTL < 0:
		return fmt.Errorf("consumer: --mix-cache-ttl must be > 0, got %s", o.TTL)
	case o.StandbyTTL < 0:
		return fmt.Errorf("consumer: --mix-cache-standby-ttl must be > 0, got %s", o.StandbyTTL)
	case o.NotFoundTTL < 0:
		return fmt.Errorf("consumer: --mix-cache-notfound-ttl must be > 0, got %s", o.NotFoundTTL)
	case o.RetryMin < 0 || o.RetryMax < 0 || (o.RetryMax != 0 && o.RetryMin > o.RetryMax):
		return fmt.Errorf("consumer: mix retry backoff must satisfy 0 < min ≤ max, got %s and %s", o.RetryMin, o.RetryMax)
	}
	return nil
}

// CacheStats are counters of a MixCache since it was made.
type CacheStats struct {
	Hits, Misses int64 // lookups answered from the cache / needing a fetch
	Fetches      int64 // calls to the MixSource
	Retries      int64 // fetches that failed transiently and were retried
	StaleServed  int64 // expired listings used because a refresh failed transiently
	NotFound     int64 // fetches answered 404
	Entries      int   // listings and 404s held now
}

// MixCache holds prepared listings by mix id. Safe for concurrent use.
type MixCache struct {
	src  MixSource
	opts CacheOptions

	mu       sync.Mutex
	entries  map[int64]*list.Element // of *cacheEntry
	lru      list.List               // front = most recently used
	inflight map[int64]*flight

	hits, misses, fetches, retries, stale, notFound atomic.Int64
}

type cacheEntry struct {
	id       int64
	listing  *Listing // nil for a remembered 404
	expires  time.Time
	standby  bool
	notFound bool
}

type flight struct {
	done    chan struct{}
	listing *Listing
	err     error
}

// NewMixCache returns a cache over src.
func NewMixCache(src MixSource, opts CacheOptions) (*MixCache, error) {
	if src == nil {
		return nil, errors.New("consumer: a MixSource is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	return &MixCache{src: src, opts: opts, entries: make(map[int64]*list.Element), inflight: make(map[int64]*flight)}, nil
}

// Stats returns the counters.
func (c *MixCache) Stats() CacheStats {
	c.mu.Lock()
	n := len(c.entries)
	c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Fetches: c.fetches.Load(),
		Retries: c.retries.Load(), StaleServed: c.stale.Load(), NotFound: c.notFound.Load(), Entries: n}
}

// Lookup answers from the cache without waiting: the listing when a fresh
// one is held; ErrUnknownMix when a 404 is remembered; (nil, nil) on a miss.
func (c *MixCache) Lookup(id int64) (*Listing, error) {
	now := c.opts.Now()
	c.mu.Lock()
	el, ok := c.entries[id]
	if ok {
		e := el.Value.(*cacheEntry)
		if now.Before(e.expires) {
			c.lru.MoveToFront(el)
			c.mu.Unlock()
			c.hits.Add(1)
			if e.notFound {
				return nil, ErrUnknownMix
			}
			return e.listing, nil
		}
	}
	c.mu.Unlock()
	return nil, nil
}

// Get returns the listing of mix id, fetching it on a miss. Concurrent Gets
// of one mix share one fetch. A transient failure (500, 503, 401, timeout,
// network, undecodable answer) is retried with backoff until ctx ends; an
// expired listing is served meanwhile when one is held. It returns
// ErrUnknownMix on 404, an error wrapping ErrMisconfigured when the API
// refuses this client for good, or ctx's error.
func (c *MixCache) Get(ctx context.Context, id int64) (*Listing, error) {
	if l, err := c.Lookup(id); l != nil || err != nil {
		return l, err
	}
	c.misses.Add(1)
	for {
		c.mu.Lock()
		f, waiting := c.inflight[id]
		if !waiting {
			f = &flight{done: make(chan struct{})}
			c.inflight[id] = f
		}
		c.mu.Unlock()
		if waiting {
			select {
			case <-f.done:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if f.err != nil && ctx.Err() == nil && (errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded)) {
				continue // the leader gave up (its ctx ended); we lead the next try
			}
			return f.listing, f.err
		}
		f.listing, f.err = c.fetch(ctx, id)
		c.mu.Lock()
		delete(c.inflight, id)
		c.mu.Unlock()
		close(f.done)
		return f.listing, f.err
	}
}

// fetch calls the source until it answers for good or ctx ends.
func (c *MixCache) fetch(ctx context.Context, id int64) (*Listing, error) {
	for attempt := 1; ; attempt++ {
		c.fetches.Add(1)
		m, meta, err := c.src.Mix(ctx, id)
		if err == nil {
			l := PrepareListing(m, meta)
			if l.MixID == 0 {
				l.MixID = id
			}
			c.store(id, l, false)
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		// One place decides "retry or not":
		switch partnerapi.KindOf(err) {
		case partnerapi.KindNotFound:
			// 404 Mix not found: the event is rejected; remembered briefly
			// so a burst of events of a removed mix costs one call.
			c.notFound.Add(1)
			c.store(id, nil, true)
			return nil, ErrUnknownMix
		case partnerapi.KindEdgeBlocked:
			// 403 edge 1010: our User-Agent is blocked; no retry fixes it.
			return nil, fmt.Errorf("%w: %w", ErrMisconfigured, err)
		default:
			// 500, 503, timeout, connection error (KindTransient); 401 (the
			// client has dropped its token and takes a new session on the
			// next call); 400 or an undecodable answer for a mix id we sent
			// correctly is the API misbehaving: all retried, never turned
			// into a rejection.
		}
		c.retries.Add(1)
		if l := c.serveStale(id); l != nil {
			c.opts.Logger.Warn("mix refresh failed; using the expired listing meanwhile", "mix_id", id, "err", err)
			return l, nil
		}
		wait := backoff.Step(c.opts.RetryMin, c.opts.RetryMax, attempt)
		var apiErr *partnerapi.Error
		if errors.As(err, &apiErr) && apiErr.RetryAfter > wait {
			wait = min(apiErr.RetryAfter, c.opts.RetryMax)
		}
		wait = wait/2 + rand.N(wait/2+1) // jitter in [wait/2, wait]
		if attempt == 1 || attempt%10 == 0 {
			c.opts.Logger.Warn("mix fetch failed; retrying while the partition waits", "mix_id", id, "attempt", attempt, "retry_in", wait, "err", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// serveStale returns an expired listing of id, if one is held, keeping it
// for another StandbyTTL (refreshed again after that).
func (c *MixCache) serveStale(id int64) *Listing {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[id]
	if !ok {
		return nil
	}
	e := el.Value.(*cacheEntry)
	if e.notFound || e.listing == nil {
		return nil
	}
	e.expires = c.opts.Now().Add(c.opts.StandbyTTL)
	c.stale.Add(1)
	return e.listing
}

func (c *MixCache) store(id int64, l *Listing, notFound bool) {
	ttl := c.opts.TTL
	switch {
	case notFound:
		ttl = c.opts.NotFoundTTL
	case l.Standby:
		ttl = c.opts.StandbyTTL
	}
	e := &cacheEntry{id: id, listing: l, notFound: notFound, standby: l != nil && l.Standby, expires: c.opts.Now().Add(ttl)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[id]; ok {
		el.Value = e
		c.lru.MoveToFront(el)
		return
	}
	c.entries[id] = c.lru.PushFront(e)
	for len(c.entries) > c.opts.Size {
		last := c.lru.Back()
		c.lru.Remove(last)
		delete(c.entries, last.Value.(*cacheEntry).id)
	}
}

// registerMetrics exports the counters as playpipe.mixcache.hits and
// playpipe.mixcache.misses (observable counters read at collection time, so
// lookups cost no metric call). The returned func unregisters them.
func (c *MixCache) registerMetrics(m metric.Meter) (func(), error) {
	hits, err := m.Int64ObservableCounter("playpipe.mixcache.hits", metric.WithDescription("mix lookups answered from the cache"))
	if err != nil {
		return func() {}, err
	}
	misses, err := m.Int64ObservableCounter("playpipe.mixcache.misses", metric.WithDescription("mix lookups that needed a fetch from the partner API"))
	if err != nil {
		return func() {}, err
	}
	fetches, err := m.Int64ObservableCounter("playpipe.mixcache.fetches", metric.WithDescription("calls to GET /partners/mix/{id}, retries included"))
	if err != nil {
		return func() {}, err
	}
	reg, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		o.ObserveInt64(hits, c.hits.Load())
		o.ObserveInt64(misses, c.misses.Load())
		o.ObserveInt64(fetches, c.fetches.Load())
		return nil
	}, hits, misses, fetches)
	if err != nil {
		return func() {}, err
	}
	return func() { _ = reg.Unregister() }, nil
}
