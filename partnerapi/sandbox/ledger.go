package sandbox

import (
	"hash/maphash"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Flag is a quality flag of an accepted play report: something the live
// service accepts but that corrupts reporting.
type Flag string

// The quality flags.
const (
	// FlagPlayedAtNot13Digits: playedat is not a 13-digit epoch in
	// milliseconds (e.g. seconds were sent).
	FlagPlayedAtNot13Digits Flag = "playedat_not_13_digits"
	// FlagCountryLowercase: country has a lowercase letter.
	FlagCountryLowercase Flag = "country_lowercase"
	// FlagUserIDMissing: userid absent, null or empty.
	FlagUserIDMissing Flag = "userid_missing"
	// FlagISRCMismatch: isrc sent and not byte-identical to the catalog's
	// ISRC for that trackid (trimmed, re-cased or re-hyphenated).
	FlagISRCMismatch Flag = "isrc_mismatch"
	// FlagTrackIDUnknown: no track of the catalog has this id.
	FlagTrackIDUnknown Flag = "trackid_unknown"
	// FlagPlayLengthExceedsTrack: playlength is longer than the track.
	FlagPlayLengthExceedsTrack Flag = "playlength_exceeds_track"
)

// LedgerEntry is one play report the live service accepted (200).
type LedgerEntry struct {
	Seq     uint64    `json:"seq"`     // arrival order over all reports (accepted, standby, rejected)
	Arrival time.Time `json:"arrival"` // when the body was read
	Raw     string    `json:"raw"`     // the body byte for byte
	Report  Report    `json:"report"`  // decoded fields (unknown ones stripped)
	Flags   []Flag    `json:"flags"`   // quality flags, never nil
	// Duplicate is true when a report with the same canonical body (the
	// decoded fields, playLength read as playlength, unknown fields
	// stripped) was accepted before.
	Duplicate   bool   `json:"duplicate"`
	ServedBy    string `json:"served_by,omitempty"`   // "" (live) or "live-bypass"
	TraceParent string `json:"traceparent,omitempty"` // W3C traceparent header, if sent
}

// HasFlag reports whether the entry carries f.
func (e LedgerEntry) HasFlag(f Flag) bool { return slices.Contains(e.Flags, f) }

// StandbyEntry is a play report answered 200 by standby: not validated,
// not forwarded, not delivered.
type StandbyEntry struct {
	Seq         uint64    `json:"seq"`
	Arrival     time.Time `json:"arrival"`
	Raw         string    `json:"raw"`
	TraceParent string    `json:"traceparent,omitempty"`
}

// RejectedEntry is a play report answered 400.
type RejectedEntry struct {
	Seq     uint64    `json:"seq"`
	Arrival time.Time `json:"arrival"`
	Raw     string    `json:"raw"`
	Message string    `json:"message"`
}

// InjectedEntry is a play report answered with an injected fault status
// (Faults): not validated, not accepted, not delivered.
type InjectedEntry struct {
	Seq     uint64    `json:"seq"`
	Arrival time.Time `json:"arrival"`
	Raw     string    `json:"raw"`
	Status  int       `json:"status"` // the injected answer's HTTP status
	Fault   string    `json:"fault"`  // FaultTrack, FaultBodyOver, FaultFailNext or FaultRate
}

// LedgerSnapshot is a copy of the ledger, entries in arrival (Seq) order.
type LedgerSnapshot struct {
	Accepted []LedgerEntry   `json:"accepted"`
	Standby  []StandbyEntry  `json:"standby"`
	Rejected []RejectedEntry `json:"rejected"`
	Injected []InjectedEntry `json:"injected"`
	// Counts include entries dropped beyond Config.MaxLedgerEntries.
	AcceptedCount int64 `json:"accepted_count"`
	StandbyCount  int64 `json:"standby_count"`
	RejectedCount int64 `json:"rejected_count"`
	// InjectedCount is the number of play reports answered with an
	// injected fault; InjectedByStatus splits it by HTTP status.
	InjectedCount    int64         `json:"injected_count"`
	InjectedByStatus map[int]int64 `json:"injected_by_status"`
	// Duplicates is the number of accepted reports whose canonical body
	// equals one accepted before (the first one is not counted).
	Duplicates int64 `json:"duplicates"`
	// Dropped is the number of entries not kept (MaxLedgerEntries).
	Dropped int64 `json:"dropped"`
	// Counters are answers per endpoint and HTTP status, edge blocks included.
	Counters map[string]map[int]int64 `json:"counters"`
}

// Flagged returns the accepted entries that carry f.
func (l LedgerSnapshot) Flagged(f Flag) []LedgerEntry {
	var out []LedgerEntry
	for _, e := range l.Accepted {
		if e.HasFlag(f) {
			out = append(out, e)
		}
	}
	return out
}

const ledgerShards = 32

type ledger struct {
	max                                        int64
	seq                                        atomic.Uint64
	stored                                     atomic.Int64
	accepted, standby, rejected, dups, dropped atomic.Int64
	injected                                   atomic.Int64
	injectedBy                                 [600]atomic.Int64 // by status
	seed1, seed2                               maphash.Seed
	shards                                     [ledgerShards]ledgerShard
}

type ledgerShard struct {
	mu       sync.Mutex
	accepted chunked[LedgerEntry]
	standby  chunked[StandbyEntry]
	rejected chunked[RejectedEntry]
	injected chunked[InjectedEntry]
	seen     map[[2]uint64]struct{}
	_        [64]byte // keep shards on separate cache lines
}

func newLedger(limit int) *ledger {
	l := &ledger{max: int64(limit), seed1: maphash.MakeSeed(), seed2: maphash.MakeSeed()}
	for i := range l.shards {
		l.shards[i].seen = map[[2]uint64]struct{}{}
	}
	return l
}

// full reports whether no further entry will be kept (until a reset).
func (l *ledger) full() bool { return l.stored.Load() >= l.max }

func (l *ledger) keep() bool {
	if l.stored.Add(1) > l.max {
		l.dropped.Add(1)
		return false
	}
	return true
}

// addAccepted records an accepted report; the canonical key decides the
// shard so that duplicate detection needs one shard lock only.
func (l *ledger) addAccepted(e LedgerEntry) {
	l.accepted.Add(1)
	var buf [256]byte
	canon := canonical(buf[:0], &e.Report)
	key := [2]uint64{maphash.Bytes(l.seed1, canon), maphash.Bytes(l.seed2, canon)}
	sh := &l.shards[key[0]%ledgerShards]
	keep := l.keep()
	sh.mu.Lock()
	// Numbered under the lock that decides which copy is the first: two
	// copies arriving together (same shard) are numbered in the order they
	// are judged, so a duplicate never precedes its first in Seq order.
	e.Seq = l.seq.Add(1)
	if _, dup := sh.seen[key]; dup {
		e.Duplicate = true
	} else {
		sh.seen[key] = struct{}{}
	}
	if keep {
		sh.accepted.add(e)
	}
	sh.mu.Unlock()
	if e.Duplicate {
		l.dups.Add(1)
	}
}

func (l *ledger) addStandby(e StandbyEntry) {
	e.Seq = l.seq.Add(1)
	l.standby.Add(1)
	store(l, e.Seq, func(sh *ledgerShard) *chunked[StandbyEntry] { return &sh.standby }, e)
}

func (l *ledger) addRejected(e RejectedEntry) {
	e.Seq = l.seq.Add(1)
	l.rejected.Add(1)
	store(l, e.Seq, func(sh *ledgerShard) *chunked[RejectedEntry] { return &sh.rejected }, e)
}

func (l *ledger) addInjected(e InjectedEntry) {
	e.Seq = l.seq.Add(1)
	l.injected.Add(1)
	if e.Status >= 100 && e.Status < 600 {
		l.injectedBy[e.Status].Add(1)
	}
	store(l, e.Seq, func(sh *ledgerShard) *chunked[InjectedEntry] { return &sh.injected }, e)
}

// store keeps the entry e numbered seq, unless the ledger is full, in the
// list of its shard that list picks.
func store[E any](l *ledger, seq uint64, list func(*ledgerShard) *chunked[E], e E) {
	if !l.keep() {
		return
	}
	sh := &l.shards[seq%ledgerShards]
	sh.mu.Lock()
	list(sh).add(e)
	sh.mu.Unlock()
}

func (l *ledger) snapshot(since uint64) LedgerSnapshot {
	s := LedgerSnapshot{Accepted: []LedgerEntry{}, Standby: []StandbyEntry{}, Rejected: []RejectedEntry{}, Injected: []InjectedEntry{}, InjectedByStatus: map[int]int64{}}
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.accepted.each(func(e *LedgerEntry) {
			if e.Seq > since {
				s.Accepted = append(s.Accepted, *e)
			}
		})
		sh.standby.each(func(e *StandbyEntry) {
			if e.Seq > since {
				s.Standby = append(s.Standby, *e)
			}
		})
		sh.rejected.each(func(e *RejectedEntry) {
			if e.Seq > since {
				s.Rejected = append(s.Rejected, *e)
			}
		})
		sh.injected.each(func(e *InjectedEntry) {
			if e.Seq > since {
				s.Injected = append(s.Injected, *e)
			}
		})
		sh.mu.Unlock()
	}
	slices.SortFunc(s.Accepted, func(a, b LedgerEntry) int { return cmpU(a.Seq, b.Seq) })
	slices.SortFunc(s.Standby, func(a, b StandbyEntry) int { return cmpU(a.Seq, b.Seq) })
	slices.SortFunc(s.Rejected, func(a, b RejectedEntry) int { return cmpU(a.Seq, b.Seq) })
	slices.SortFunc(s.Injected, func(a, b InjectedEntry) int { return cmpU(a.Seq, b.Seq) })
	s.InjectedCount = l.injected.Load()
	for st := range l.injectedBy {
		if n := l.injectedBy[st].Load(); n > 0 {
			s.InjectedByStatus[st] = n
		}
	}
	s.AcceptedCount, s.StandbyCount, s.RejectedCount = l.accepted.Load(), l.standby.Load(), l.rejected.Load()
	s.Duplicates, s.Dropped = l.dups.Load(), l.dropped.Load()
	return s
}

func (l *ledger) reset() {
	for i := range l.shards {
		sh := &l.shards[i]
		sh.mu.Lock()
		sh.accepted, sh.standby, sh.rejected = chunked[LedgerEntry]{}, chunked[StandbyEntry]{}, chunked[RejectedEntry]{}
		sh.injected = chunked[InjectedEntry]{}
		clear(sh.seen)
		sh.mu.Unlock()
	}
	l.stored.Store(0)
	l.accepted.Store(0)
	l.standby.Store(0)
	l.rejected.Store(0)
	l.dups.Store(0)
	l.dropped.Store(0)
	l.injected.Store(0)
	for st := range l.injectedBy {
		l.injectedBy[st].Store(0)
	}
}

// chunked is an append-only list in fixed-size chunks: appending never
// copies what is already stored.
type chunked[T any] struct{ chunks [][]T }

// Chunks start small (a sandbox in a unit test holds a few entries) and
// double up to maxChunk.
const minChunk, maxChunk = 8, 1024

func (c *chunked[T]) add(v T) {
	n := len(c.chunks)
	if n == 0 || len(c.chunks[n-1]) == cap(c.chunks[n-1]) {
		size := minChunk
		if n > 0 {
			size = min(2*cap(c.chunks[n-1]), maxChunk)
		}
		c.chunks = append(c.chunks, make([]T, 0, size))
		n++
	}
	c.chunks[n-1] = append(c.chunks[n-1], v)
}

func (c *chunked[T]) each(fn func(*T)) {
	for _, ch := range c.chunks {
		for i := range ch {
			fn(&ch[i])
		}
	}
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// canonical is the canonical body of a report: every known field in table
// order, absent optional fields marked absent.
func canonical(b []byte, r *Report) []byte {
	b = strconv.AppendInt(b, r.TrackID, 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, r.PlayedAt, 10)
	b = append(b, 0)
	b = strconv.AppendInt(b, r.PlayLength, 10)
	for _, s := range [...]string{r.SourceStream, r.SourceDetail, r.OS, r.Device, r.Country} {
		b = append(b, 0)
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, ':')
		b = append(b, s...)
	}
	b = append(b, 0)
	b = strconv.AppendInt(b, r.Vendor, 10)
	for _, p := range [...]*string{r.UserID, r.ISRC} {
		b = append(b, 0)
		if p == nil {
			b = append(b, '-')
			continue
		}
		b = strconv.AppendInt(b, int64(len(*p)), 10)
		b = append(b, ':')
		b = append(b, *p...)
	}
	b = append(b, 0)
	if r.EndReason == nil {
		b = append(b, '-')
	} else {
		b = strconv.AppendInt(b, *r.EndReason, 10)
	}
	for _, p := range [...]*bool{r.CachedPlay, r.JumpForward} {
		b = append(b, 0)
		switch {
		case p == nil:
			b = append(b, '-')
		case *p:
			b = append(b, 't')
		default:
			b = append(b, 'f')
		}
	}
	return b
}

// qualityFlags computes the flags of an accepted report against the catalog.
func qualityFlags(r *Report, c *Catalog) []Flag {
	flags := []Flag{}
	if r.PlayedAt < 1_000_000_000_000 || r.PlayedAt > 9_999_999_999_999 {
		flags = append(flags, FlagPlayedAtNot13Digits)
	}
	if r.Country[0] >= 'a' || r.Country[1] >= 'a' {
		flags = append(flags, FlagCountryLowercase)
	}
	if r.UserID == nil || *r.UserID == "" {
		flags = append(flags, FlagUserIDMissing)
	}
	t, ok := c.trackByID[r.TrackID]
	if !ok {
		return append(flags, FlagTrackIDUnknown)
	}
	if r.ISRC != nil && *r.ISRC != t.ISRC {
		flags = append(flags, FlagISRCMismatch)
	}
	if r.PlayLength > int64(t.LengthSec) {
		flags = append(flags, FlagPlayLengthExceedsTrack)
	}
	return flags
}

// counters count answers per endpoint and status without locks.
type counters struct {
	c [numEndpoints][600]atomic.Int64
}

func (c *counters) add(ep endpoint, status int) {
	if status < 100 || status >= 600 {
		status = 599
	}
	c.c[ep][status].Add(1)
}

func (c *counters) snapshot() map[string]map[int]int64 {
	out := map[string]map[int]int64{}
	for ep := range c.c {
		for st := range c.c[ep] {
			if n := c.c[ep][st].Load(); n > 0 {
				m := out[endpointNames[ep]]
				if m == nil {
					m = map[int]int64{}
					out[endpointNames[ep]] = m
				}
				m[st] = n
			}
		}
	}
	return out
}

func (c *counters) reset() {
	for ep := range c.c {
		for st := range c.c[ep] {
			c.c[ep][st].Store(0)
		}
	}
}
