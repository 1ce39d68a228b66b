package simulator

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/playpipe/playpipe/internal/confcheck"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/internal/telemetry"
	"github.com/playpipe/playpipe/schemas"
)

const instrumentation = "github.com/playpipe/playpipe/producer/simulator"

// MixInfo is what the simulator needs to know of a mix of the catalog.
type MixInfo struct {
	ID       int64
	LengthMS int64
	// TrackStartsMS are the start times of the tracks in the mix (any order).
	TrackStartsMS []int64
}

// Kinds of the messages the simulator sends.
const (
	KindValid         = "valid"          // a realistic segment: passes schemas.ParseEvent
	KindMalformedJSON = "malformed_json" // a truncated or garbled event: not JSON
	KindMissingField  = "missing_field"  // a required field (not user_id) is absent
	KindUnknownMix    = "unknown_mix"    // a valid event whose mix_id is not in the catalog
	KindBadCountry    = "bad_country"    // country is not two ASCII letters
)

// Kinds lists every kind, the bad ones in the order they are chosen.
var Kinds = []string{KindValid, KindMalformedJSON, KindMissingField, KindUnknownMix, KindBadCountry}

// Simulated end_reason values (the partner API does not publish its codes).
const (
	EndFinished = 1 // the mix played to its end
	EndSeek     = 2 // the listener sought to another position
	EndPause    = 3 // the listener paused; playback resumes later at the same position
	EndStop     = 4 // the listener stopped mid-track
	EndSkip     = 5 // the listener skipped to the next track
)

// Config configures a simulation run. Zero values take the defaults named
// in the comments.
type Config struct {
	// Kafka is the connection (brokers, SASL, TLS); at least one broker.
	Kafka kafkax.Config
	// Topic receives the events; defaults to Kafka.Topics().Events.
	Topic string
	// Mixes is the catalog to listen to; required.
	Mixes []MixInfo
	// Events is how many messages to send; required (> 0).
	Events int
	// Rate bounds the messages per second; 0 sends as fast as Kafka takes them.
	Rate float64
	// Devices is the fleet size; defaults to 200. Users defaults to 80% of
	// Devices (some users listen on several devices).
	Devices int
	Users   int
	// BadShare is the share of bad messages, 0–1, spread evenly over the
	// four bad kinds.
	BadShare float64
	// Seed makes the run deterministic: the same configuration sends the
	// same messages in the same order.
	Seed int64
	// StartMS is the simulated clock's start (epoch ms); defaults to
	// DefaultStart(Now()): 28 days before the current UTC day, so that
	// the events are plausible (the pipeline rejects a started_at more than
	// 30 days before or 1 day after its arrival as implausible_time) and a
	// seed fixes the events within a UTC day. Set it for events fixed for
	// ever. The simulated clocks advance about devices⁻¹ × events × 4.5
	// minutes (25 days for 200 000 events over 150 devices), faster than
	// the real clock at a high rate, so the generator holds them to the
	// simulator's clock as it runs (holdToClock): a segment never ends
	// after Now, and with the default start a device's clock never falls
	// more than MaxLag behind Now, however long the run.
	StartMS int64
	// Now is the simulator's clock; defaults to time.Now. Tests inject one.
	Now func() time.Time
	// BatchSize is the messages per synchronous write; defaults to 2000.
	// BatchTimeout is kafka-go's Writer.BatchTimeout, set deliberately:
	// kafka-go's 1 s default would make every synchronous write wait a
	// second for a partition batch to fill. Defaults to 2 ms.
	BatchSize    int
	BatchTimeout time.Duration
	// Record, when set, receives one JSON line per message acknowledged by
	// Kafka: {"kind":…,"key":…,"value":…} (value as a string).
	Record io.Writer
	// TracerProvider makes one producer span per message, whose trace
	// context goes into the message headers (as the Publisher does); the
	// command passes telemetry.Role.Providers.Tracer. Nil: a no-op provider
	// (no span, no header; no otel global is read).
	TracerProvider trace.TracerProvider
	// Propagator writes the trace context into the message headers. Nil:
	// W3C trace context plus baggage (telemetry.Propagator), as everywhere
	// in playpipe.
	Propagator propagation.TextMapPropagator

	// anchored: StartMS was the default, relative to Now (holdToClock also
	// keeps the clocks from falling behind).
	anchored bool
}

// MaxLag is how far behind the simulator's clock a device's clock may fall
// with the default start (DefaultStartBack plus the day DefaultStart rounds
// down): inside the pipeline's default plausible window of 30 days back.
const MaxLag = DefaultStartBack + 24*time.Hour

// DefaultStartMS is 2024-01-01T00:00:00Z, the fixed start of earlier
// releases: events from it are now implausible unless the pipeline's window
// (--time-window-back) reaches back to it.
const DefaultStartMS = 1704067200000

// DefaultStartBack is how far before the current UTC day DefaultStart puts
// the simulated clock's start.
const DefaultStartBack = 28 * 24 * time.Hour

// DefaultStart is the default Config.StartMS at now: the start of now's UTC
// day minus DefaultStartBack.
func DefaultStart(now time.Time) int64 {
	return now.UTC().Truncate(24 * time.Hour).Add(-DefaultStartBack).UnixMilli()
}

func (c *Config) setDefaults() {
	if c.Topic == "" {
		c.Topic = c.Kafka.Topics().Events
	}
	if c.Devices == 0 {
		c.Devices = 200
	}
	if c.Users == 0 {
		c.Users = max(1, c.Devices*4/5)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.StartMS == 0 {
		c.StartMS = DefaultStart(c.Now())
		c.anchored = true
	}
	if c.BatchSize == 0 {
		c.BatchSize = 2000
	}
	if c.BatchTimeout == 0 {
		c.BatchTimeout = 2 * time.Millisecond
	}
	if c.Kafka.Partitions == 0 {
		c.Kafka.Partitions = 6
	}
	c.TracerProvider = telemetry.OrNoopTracerProvider(c.TracerProvider)
	c.Propagator = telemetry.OrW3CPropagator(c.Propagator)
}

func (c *Config) validateGen() error {
	if len(c.Mixes) == 0 {
		return errors.New("simulator: Config.Mixes is empty: the simulator needs a catalog (--mixes or the partner API)")
	}
	if err := confcheck.First(
		confcheck.Rule(c.Events < 1, "simulator: Config.Events (--events)", "≥ 1", c.Events),
		confcheck.Rule(c.Devices < 1, "simulator: Config.Devices (--devices)", "≥ 1", c.Devices),
		confcheck.Rule(c.Users < 1, "simulator: Config.Users (--users)", "≥ 1", c.Users),
		confcheck.Rule(!(c.BadShare >= 0 && c.BadShare <= 1), "simulator: Config.BadShare (--bad-share)", "within 0–1", c.BadShare),
		confcheck.Rule(c.Rate < 0, "simulator: Config.Rate (--rate)", "≥ 0 (0: unlimited)", c.Rate),
	); err != nil {
		return err
	}
	for _, m := range c.Mixes {
		if m.LengthMS < 1000 {
			return fmt.Errorf("simulator: Config.Mixes: mix %d is %d ms long; at least 1 s is required", m.ID, m.LengthMS)
		}
	}
	return nil
}

func (c *Config) validate() error {
	if err := c.validateGen(); err != nil {
		return err
	}
	if len(c.Kafka.Brokers) == 0 {
		return errors.New("simulator: Config.Kafka.Brokers is empty; at least one host:port is required")
	}
	if err := confcheck.First(
		confcheck.Rule(c.BatchSize < 1, "simulator: Config.BatchSize", "≥ 1", c.BatchSize),
		confcheck.Rule(c.BatchTimeout < 0, "simulator: Config.BatchTimeout", "≥ 0", c.BatchTimeout),
	); err != nil {
		return err
	}
	if err := c.Kafka.Validate(); err != nil {
		return fmt.Errorf("simulator: %w", err)
	}
	return nil
}

// Message is one message of the simulation.
type Message struct {
	Kind  string
	Key   []byte
	Value []byte
}

// Stats tells what a run sent (acknowledged by Kafka).
type Stats struct {
	Sent    int
	ByKind  map[string]int
	Elapsed time.Duration
}

func (s Stats) String() string {
	var b strings.Builder
	rate := 0.0
	if s.Elapsed > 0 {
		rate = float64(s.Sent) / s.Elapsed.Seconds()
	}
	fmt.Fprintf(&b, "sent %d events in %s (%.0f/s):", s.Sent, s.Elapsed.Round(time.Millisecond), rate)
	for _, k := range Kinds {
		fmt.Fprintf(&b, " %s=%d", k, s.ByKind[k])
	}
	return b.String()
}

var (
	simCountries = []string{"US", "US", "US", "DE", "DE", "GB", "GB", "FR", "BR", "JP", "NL", "SE", "ES", "IT", "CA", "AU", "MX", "PL"}
	simPlatforms = []struct {
		os, device string
		vendor     int64
	}{
		{"iOS 17.4", "phone", 1}, {"iOS 16.7", "phone", 1}, {"Android 14", "phone", 2}, {"Android 13", "phone", 2},
		{"iPadOS 17.4", "tablet", 1}, {"Android 12", "tablet", 2}, {"tvOS 17.4", "tv", 1}, {"webOS 23", "tv", 5},
		{"Windows 11", "desktop", 3}, {"macOS 14.4", "desktop", 1}, {"Android Automotive 13", "car", 6},
		{"Linux 6.1", "speaker", 7}, {"watchOS 10.4", "watch", 1}, {"Web Chrome 124", "browser", 4},
	}
	simBadCountries  = []string{"DEU", "Germany", "D1", "", "U$", "1", "USA", "ü"}
	simRequiredDrops = []string{"event_id", "mix_id", "started_at", "offset_ms", "duration_ms", "country", "os", "device", "vendor"}
)

type simDevice struct {
	id, user, country string
	platform          int
	legacy            bool  // an old app: sends no jump_forward / end_reason / cached
	cacheCapable      bool  // may play from cache
	clock             int64 // the device's simulated now, epoch ms
	seq               int

	mix     *simMix // nil: idle
	pos     int64   // position in the mix of the next segment
	cached  bool    // this session plays from cache
	jumpNew bool    // the next segment starts after a jump forward
}

type simMix struct {
	MixInfo
	starts []int64 // sorted, clipped to the mix
}

// Generator produces the simulation's messages, deterministically for a
// seed. Not safe for concurrent use.
type Generator struct {
	cfg      Config
	rng      *rand.Rand
	mixes    []simMix
	devices  []simDevice
	unknown  int64 // first mix id above every catalog id
	produced int
	anchors  map[anchor]bool // where recent segments played their mixes from (holdToClock)
}

// NewGenerator validates the generation settings of cfg (Kafka settings
// are not needed) and returns a generator.
func NewGenerator(cfg Config) (*Generator, error) {
	cfg.setDefaults()
	if err := cfg.validateGen(); err != nil {
		return nil, err
	}
	g := &Generator{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x706c61797069706))}
	for _, m := range cfg.Mixes {
		sm := simMix{MixInfo: m}
		for _, s := range m.TrackStartsMS {
			if s >= 0 && s < m.LengthMS {
				sm.starts = append(sm.starts, s)
			}
		}
		sort.Slice(sm.starts, func(i, j int) bool { return sm.starts[i] < sm.starts[j] })
		sm.starts = slices.Compact(sm.starts)
		g.mixes = append(g.mixes, sm)
		g.unknown = max(g.unknown, m.ID+1)
	}
	for i := 0; i < cfg.Devices; i++ {
		g.devices = append(g.devices, simDevice{
			id:           fmt.Sprintf("dev-%05d", i),
			user:         fmt.Sprintf("user-%05d", g.rng.IntN(cfg.Users)),
			country:      simCountries[g.rng.IntN(len(simCountries))],
			platform:     g.rng.IntN(len(simPlatforms)),
			legacy:       g.rng.IntN(10) == 0,
			cacheCapable: g.rng.IntN(3) == 0,
			clock:        cfg.StartMS + g.rng.Int64N(3_600_000),
		})
	}
	return g, nil
}

// Next returns the next message; ok is false after cfg.Events messages.
func (g *Generator) Next() (m Message, ok bool) {
	if g.produced >= g.cfg.Events {
		return Message{}, false
	}
	g.produced++
	d := &g.devices[g.rng.IntN(len(g.devices))]
	ev := g.segment(d)
	kind := KindValid
	if g.cfg.BadShare > 0 && g.rng.Float64() < g.cfg.BadShare {
		kind = Kinds[1+g.rng.IntN(len(Kinds)-1)]
	}
	return g.encode(kind, d, ev), true
}

// segment advances device d by one listening segment and returns its event.
func (g *Generator) segment(d *simDevice) schemas.PlayerEvent {
	if d.mix == nil { // idle: a new session after a while
		d.clock += 1000 + g.rng.Int64N(20*60_000)
		d.mix = &g.mixes[g.zipf(len(g.mixes))]
		d.pos, d.jumpNew = 0, false
		if len(d.mix.starts) > 1 && g.rng.IntN(6) == 0 { // resume a mix somewhere
			d.pos, d.jumpNew = d.mix.starts[1+g.rng.IntN(len(d.mix.starts)-1)], true
		}
		d.cached = d.cacheCapable && g.rng.IntN(2) == 0
	}
	m := d.mix
	if d.pos >= m.LengthMS {
		d.pos = 0
	}
	remaining := m.LengthMS - d.pos
	d.seq++
	p := simPlatforms[d.platform]
	vendor := p.vendor
	ev := schemas.PlayerEvent{
		EventID:   fmt.Sprintf("sim%d-%s-%d", g.cfg.Seed, d.id, d.seq),
		MixID:     m.ID,
		StartedAt: d.clock,
		OffsetMS:  d.pos,
		UserID:    d.user,
		Country:   d.country,
		OS:        p.os,
		Device:    p.device,
		Vendor:    &vendor,
	}
	dur, end, next, jump := g.listen(d, m, remaining)
	ev.StartedAt = g.holdToClock(d, m.ID, d.pos, dur)
	ev.DurationMS = dur
	d.optionalFields(&ev, end)
	d.clock += dur
	if end == EndPause {
		d.clock += 2000 + g.rng.Int64N(10*60_000)
	} else {
		d.clock += g.rng.Int64N(800) // decoder and network latency between segments
	}
	if next < 0 || next >= m.LengthMS {
		d.mix = nil
	} else {
		d.pos, d.jumpNew = next, jump
	}
	return ev
}

// holdToClock keeps device d's segment of dur ms within the simulator's
// clock and returns its start: a device reports a segment once it has
// ended, so a segment never ends after Now (the pipeline refuses a
// started_at more than a day ahead of its arrival: a load generator whose
// simulated clocks ran ahead of the real one had most of its events refused
// after 25 minutes at 300/s). A device that listened faster than the clock
// runs is held at it: its segment ends at Now (overlapping its previous
// ones). With the default start (anchored) a device's clock is also kept
// at most MaxLag behind Now, so a slow run of days stays inside the window.
// Two held segments of a device never repeat each other's plays.
func (g *Generator) holdToClock(d *simDevice, mix, pos, dur int64) int64 {
	now := g.cfg.Now().UnixMilli()
	if d.clock > now-dur {
		d.clock = now - dur
	}
	if g.cfg.anchored && d.clock < now-MaxLag.Milliseconds() {
		d.clock = now - MaxLag.Milliseconds()
	}
	// Held segments all end at Now: one that plays a mix from the same
	// anchor (start − offset) as an earlier segment of the same listener
	// would repeat its plays exactly (the same tracks, starts and user), as
	// a player that starts a mix again within the same millisecond. It
	// starts a millisecond earlier instead, still ending by Now.
	if g.anchors == nil || len(g.anchors) >= 1<<16 {
		g.anchors = map[anchor]bool{}
	}
	for g.anchors[anchor{d.user, mix, d.clock - pos}] {
		d.clock--
	}
	g.anchors[anchor{d.user, mix, d.clock - pos}] = true
	return d.clock
}

// anchor is where a segment plays a mix from: the listener, the mix and
// the instant its position 0 falls on.
type anchor struct {
	user    string
	mix, at int64
}

// listen picks how the listener plays the segment that starts at d.pos
// (remaining ms before the end of mix m): its duration, end reason, the
// position of the next segment (-1: the session ends) and whether that one
// starts after a jump forward.
func (g *Generator) listen(d *simDevice, m *simMix, remaining int64) (dur, end, next int64, jump bool) {
	next = -1
	switch r := g.rng.IntN(100); {
	case r < 30: // plays through to the end of the mix
		dur, end = remaining, EndFinished
	case r < 50: // pause, resume later at the same position
		dur, end = g.part(remaining), EndPause
		next = d.pos + dur
	case r < 70: // skip to the next track
		cur := d.pos + 1 + g.rng.Int64N(max(1, min(remaining-1, 240_000)))
		nt := nextStart(m.starts, d.pos)
		if nt < 0 || nt >= m.LengthMS {
			dur, end = remaining, EndFinished
			break
		}
		dur, end = min(cur, nt)-d.pos, EndSkip
		if dur < 1 {
			dur = 1
		}
		next, jump = nt, true
	case r < 85: // seek somewhere else in the mix
		dur, end = g.part(remaining), EndSeek
		next = g.rng.Int64N(m.LengthMS)
		jump = next > d.pos+dur
	default: // stop mid-track
		dur, end = g.part(remaining), EndStop
	}
	if d.pos+dur >= m.LengthMS { // whatever the listener meant to do, the mix ended
		dur, end, next = remaining, EndFinished, -1
	}
	return dur, end, next, jump
}

// optionalFields sets the fields that depend on the device's app: an old
// (legacy) app sends no end_reason, jump_forward or cached, but still flags
// cached plays.
func (d *simDevice) optionalFields(ev *schemas.PlayerEvent, end int64) {
	if !d.legacy {
		ev.EndReason = &end
		if d.jumpNew || d.seq%4 == 0 { // present also when false now and then
			j := d.jumpNew
			ev.JumpForward = &j
		}
		if d.cacheCapable {
			c := d.cached
			ev.Cached = &c
		}
	}
	if d.cached && d.legacy { // old apps still flag cached plays
		c := true
		ev.Cached = &c
	}
}

// part is a segment length within remaining: mostly tens of seconds to minutes,
// sometimes under a second.
func (g *Generator) part(remaining int64) int64 {
	var d int64
	if g.rng.IntN(20) == 0 {
		d = 1 + g.rng.Int64N(1500)
	} else {
		d = 5000 + g.rng.Int64N(15*60_000)
	}
	return max(1, min(d, remaining))
}

// zipf picks an index in [0, n) with a skew towards the first ones (popular mixes).
func (g *Generator) zipf(n int) int {
	u := g.rng.Float64()
	return min(n-1, int(float64(n)*u*u*u))
}

func nextStart(starts []int64, pos int64) int64 {
	for _, s := range starts {
		if s > pos {
			return s
		}
	}
	return -1
}

func (g *Generator) encode(kind string, d *simDevice, ev schemas.PlayerEvent) Message {
	valid, _ := json.Marshal(&ev)
	m := Message{Kind: kind, Key: []byte(ev.EventID), Value: valid}
	switch kind {
	case KindUnknownMix:
		ev.MixID = g.unknown + g.rng.Int64N(1_000_000)
		m.Value, _ = json.Marshal(&ev)
	case KindBadCountry:
		ev.Country = simBadCountries[g.rng.IntN(len(simBadCountries))]
		m.Value, _ = json.Marshal(&ev)
	case KindMissingField:
		var obj map[string]json.RawMessage
		_ = json.Unmarshal(valid, &obj)
		drop := simRequiredDrops[g.rng.IntN(len(simRequiredDrops))]
		delete(obj, drop)
		m.Value, _ = json.Marshal(obj)
		if drop == "event_id" {
			m.Key = []byte(d.id)
		}
	case KindMalformedJSON:
		switch g.rng.IntN(3) {
		case 0: // truncated in transit
			m.Value = valid[:1+g.rng.IntN(len(valid)-2)]
		case 1: // a non-JSON log line
			m.Value = []byte(fmt.Sprintf("player %s: segment %d ended (mix %d)", d.id, d.seq, ev.MixID))
		default: // single quotes, a classic hand-rolled encoder bug
			m.Value = bytes.ReplaceAll(valid, []byte(`"`), []byte(`'`))
		}
		m.Key = []byte(d.id)
	}
	return m
}
