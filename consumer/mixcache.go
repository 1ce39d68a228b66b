package consumer

import (
	"cmp"
	"container/list"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/playpipe/playpipe/internal/backoff"
	"github.com/playpipe/playpipe/internal/confcheck"
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

// ErrMixUnavailable is wrapped by the error MixCache returns for a mix the
// partner API kept answering 400 or an undecodable body for (see
// CacheConfig.UnavailableAttempts): events of it are rejected as
// mix_unavailable, raw bytes kept, so they can be re-driven once the API
// serves the mix.
var ErrMixUnavailable = errors.New("consumer: mix unavailable from the partner API")

// ErrInvalidConfig wraps a partner API failure that no retry fixes (the edge
// blocked our User-Agent, or the session endpoint refused our credentials):
// the enricher stops and says so.
var ErrInvalidConfig = errors.New("consumer: partner API refuses this client (configuration error)")

// CacheConfig configures a MixCache. Zero fields take the stated defaults.
type CacheConfig struct {
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
	// UnavailableAttempts and UnavailableAfter are the policy for a mix the
	// API answers 400 or with a body that does not decode (the API
	// misbehaving for an id we sent correctly): it is retried with backoff
	// until it has failed so at least UnavailableAttempts times over at
	// least UnavailableAfter (500, 503 and network errors in between
	// neither count nor reset; an answer does), then declared unavailable:
	// its events are rejected as mix_unavailable, and the verdict is
	// remembered for NotFoundTTL. Defaults 5 and 30s.
	UnavailableAttempts int
	UnavailableAfter    time.Duration
	// RetryMin and RetryMax bound the exponential backoff (with jitter)
	// between fetches after a transient failure; default 100ms and 5s. A
	// server's Retry-After is honoured up to RetryMax.
	RetryMin, RetryMax time.Duration
	// Logger receives retry warnings; defaults to slog.Default().
	Logger *slog.Logger
	// Now is the clock; defaults to time.Now (tests set it).
	Now func() time.Time
}

func (o *CacheConfig) setDefaults() {
	o.Size = cmp.Or(o.Size, 10000)
	o.TTL = cmp.Or(o.TTL, 10*time.Minute)
	o.StandbyTTL = cmp.Or(o.StandbyTTL, 30*time.Second)
	o.NotFoundTTL = cmp.Or(o.NotFoundTTL, 30*time.Second)
	o.UnavailableAttempts = cmp.Or(o.UnavailableAttempts, 5)
	o.UnavailableAfter = cmp.Or(o.UnavailableAfter, 30*time.Second)
	o.RetryMin = cmp.Or(o.RetryMin, 100*time.Millisecond)
	o.RetryMax = cmp.Or(o.RetryMax, 5*time.Second)
	o.Logger = cmp.Or(o.Logger, slog.Default())
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks the options once; errors name the flag.
func (o CacheConfig) Validate() error {
	if err := confcheck.First(
		confcheck.Rule(o.Size < 0, "consumer: --mix-cache-size", "≥ 1", o.Size),
		confcheck.Rule(o.TTL < 0, "consumer: --mix-cache-ttl", "> 0", o.TTL),
		confcheck.Rule(o.StandbyTTL < 0, "consumer: --mix-cache-standby-ttl", "> 0", o.StandbyTTL),
		confcheck.Rule(o.NotFoundTTL < 0, "consumer: --mix-cache-notfound-ttl", "> 0", o.NotFoundTTL),
		confcheck.Rule(o.UnavailableAttempts < 0, "consumer: --mix-unavailable-attempts", "≥ 1", o.UnavailableAttempts),
		confcheck.Rule(o.UnavailableAfter < 0, "consumer: --mix-unavailable-after", "≥ 0", o.UnavailableAfter),
	); err != nil {
		return err
	}
	if o.RetryMin < 0 || o.RetryMax < 0 || (o.RetryMax != 0 && o.RetryMin > o.RetryMax) {
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
	Unavailable  int64 // mixes declared unavailable (UnavailableAttempts)
	Entries      int   // listings and 404s held now
}

// MixCache holds prepared listings by mix id. Safe for concurrent use.
type MixCache struct {
	src  MixSource
	opts CacheConfig

	mu       sync.Mutex
	entries  map[int64]*list.Element // of *cacheEntry
	lru      list.List               // front = most recently used
	inflight map[int64]*flight
	trouble  map[int64]*trouble // mixes answering 400 or undecodable bodies, until they answer or are declared unavailable

	hits, misses, fetches, retries, stale, notFound, unavailable atomic.Int64

	// retry is the wait between fetches after a transient failure: equal
	// jitter over the exponential step, at least the server's Retry-After
	// (both capped at RetryMax).
	retry backoff.Policy
}

// trouble counts the 400 or undecodable answers of one mix.
type trouble struct {
	first time.Time
	n     int
}

type cacheEntry struct {
	id       int64
	listing  *Listing // nil for a remembered 404
	expires  time.Time
	standby  bool
	notFound bool
	// unavail, when set, is the remembered verdict of a mix declared
	// unavailable (wraps ErrMixUnavailable).
	unavail error
}

type flight struct {
	done    chan struct{}
	listing *Listing
	err     error
}

// NewMixCache returns a cache over src.
func NewMixCache(src MixSource, opts CacheConfig) (*MixCache, error) {
	if src == nil {
		return nil, errors.New("consumer: a MixSource is required")
	}
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	return &MixCache{src: src, opts: opts, entries: make(map[int64]*list.Element), inflight: make(map[int64]*flight), trouble: make(map[int64]*trouble),
		retry: backoff.Policy{Initial: opts.RetryMin, Max: opts.RetryMax, Jitter: backoff.Equal, RetryAfterMax: opts.RetryMax}}, nil
}

// Stats returns the counters.
func (c *MixCache) Stats() CacheStats {
	c.mu.Lock()
	n := len(c.entries)
	c.mu.Unlock()
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Fetches: c.fetches.Load(),
		Retries: c.retries.Load(), StaleServed: c.stale.Load(), NotFound: c.notFound.Load(), Unavailable: c.unavailable.Load(), Entries: n}
}

// Lookup answers from the cache without waiting: the listing when a fresh
// one is held; ErrUnknownMix when a 404 is remembered, an error wrapping
// ErrMixUnavailable when that verdict is; (nil, nil) on a miss.
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
			if e.unavail != nil {
				return nil, e.unavail
			}
			return e.listing, nil
		}
	}
	c.mu.Unlock()
	return nil, nil
}

// Get returns the listing of mix id, fetching it on a miss. Concurrent Gets
// of one mix share one fetch. A transient failure (500, 503, 401, timeout,
// network) is retried with backoff until ctx ends; an expired listing is
// served meanwhile when one is held. A 400 or undecodable answer is retried
// the same way until CacheConfig.UnavailableAttempts declares the mix
// unavailable. It returns ErrUnknownMix on 404, an error wrapping
// ErrMixUnavailable, an error wrapping ErrInvalidConfig when the API
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
			c.clearTrouble(id)
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
			c.clearTrouble(id)
			c.notFound.Add(1)
			c.store(id, nil, true)
			return nil, ErrUnknownMix
		case partnerapi.KindEdgeBlocked:
			// 403 edge 1010: our User-Agent is blocked; no retry fixes it.
			return nil, fmt.Errorf("%w: the partner API's edge blocked our User-Agent (HTTP 403, edge error 1010): %w", ErrInvalidConfig, err)
		}
		if refusedCredentials(err) {
			// 400 or 401 from the session endpoint: our client id or
			// signature is refused. No retry fixes it (the reporter stops
			// the same way).
			return nil, fmt.Errorf("%w: the partner API refused our credentials (check the client id and signature): %w", ErrInvalidConfig, err)
		}
		// Everything else is retried: 500, 503, timeout, connection error
		// (KindTransient) and 401 (the client has dropped its token and
		// takes a new session on the next call) for ever; a 400 or an
		// undecodable answer for a mix id we sent correctly (the API
		// misbehaving) until the unavailable policy gives up on the mix.
		c.retries.Add(1)
		if l := c.serveStale(id); l != nil {
			c.opts.Logger.Warn("mix refresh failed; using the expired listing meanwhile", "mix_id", id, "err", err)
			return l, nil
		}
		if misbehaving(err) {
			if verdict := c.countTrouble(id, err); verdict != nil {
				c.opts.Logger.Warn("mix declared unavailable; its events are rejected as mix_unavailable (re-drivable)", "mix_id", id, "err", err)
				return nil, verdict
			}
		}
		var retryAfter time.Duration
		if apiErr := (*partnerapi.Error)(nil); errors.As(err, &apiErr) {
			retryAfter = apiErr.RetryAfter
		}
		wait := c.retry.Delay(attempt, retryAfter)
		if attempt == 1 || attempt%10 == 0 {
			c.opts.Logger.Warn("mix fetch failed; retrying (the events of this mix wait, the others flow on)", "mix_id", id, "attempt", attempt, "retry_in", wait, "err", err)
		}
		if !backoff.Sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
}

// refusedCredentials reports whether err is the session endpoint refusing
// our credentials (400 or 401 on POST /partners/session…).
func refusedCredentials(err error) bool {
	var e *partnerapi.Error
	if !errors.As(err, &e) || !e.Endpoint.Session() {
		return false
	}
	return e.Kind == partnerapi.KindRejected || e.Kind == partnerapi.KindUnauthorized
}

// misbehaving reports whether err is an answer of the mix endpoint that no
// transient condition explains: a 400 (or another 4xx the client classes as
// rejected) for an id we sent correctly, or a 2xx whose body does not decode.
func misbehaving(err error) bool {
	var e *partnerapi.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Kind == partnerapi.KindRejected || (e.Status >= 200 && e.Status < 300)
}

// countTrouble counts one misbehaving answer of mix id; once the policy is
// met it stores and returns the unavailable verdict.
func (c *MixCache) countTrouble(id int64, err error) error {
	now := c.opts.Now()
	c.mu.Lock()
	tr := c.trouble[id]
	if tr == nil {
		tr = &trouble{first: now}
		c.trouble[id] = tr
	}
	tr.n++
	n, first := tr.n, tr.first
	done := n >= c.opts.UnavailableAttempts && now.Sub(first) >= c.opts.UnavailableAfter
	if done {
		delete(c.trouble, id)
	}
	c.mu.Unlock()
	if !done {
		return nil
	}
	c.unavailable.Add(1)
	status := 0
	var e *partnerapi.Error
	if errors.As(err, &e) {
		status = e.Status
	}
	verdict := fmt.Errorf("%w: mix %d answered HTTP %d (400 or an undecodable body) %d times over %s: %s",
		ErrMixUnavailable, id, status, n, now.Sub(first).Round(time.Millisecond), trunc(err.Error(), 200))
	c.put(&cacheEntry{id: id, unavail: verdict, expires: c.opts.Now().Add(c.opts.NotFoundTTL)})
	return verdict
}

func (c *MixCache) clearTrouble(id int64) {
	c.mu.Lock()
	delete(c.trouble, id)
	c.mu.Unlock()
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
	if e.notFound || e.listing == nil || e.unavail != nil {
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
	c.put(&cacheEntry{id: id, listing: l, notFound: notFound, standby: l != nil && l.Standby, expires: c.opts.Now().Add(ttl)})
}

// put inserts or replaces the entry of e.id, evicting the least recently
// used entries past Size.
func (c *MixCache) put(e *cacheEntry) {
	id := e.id
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
