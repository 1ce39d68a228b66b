package producer

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/time/rate"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// MixInfo is what the simulator needs to know of a mix of the catalog.
type MixInfo struct {
	ID       int64
	LengthMS int64
	// TrackStartsMS are the start times of the tracks in the mix (any order).
	TrackStartsMS []int64
}

// Kinds of the messages the simulator sends.
const (
	SimValid         = "valid"          // a realistic segment: passes schemas.ParseEvent
	SimMalformedJSON = "malformed_json" // a truncated or garbled event: not JSON
	SimMissingField  = "missing_field"  // a required field (not user_id) is absent
	SimUnknownMix    = "unknown_mix"    // a valid event whose mix_id is not in the catalog
	SimBadCountry    = "bad_country"    // country is not two ASCII letters
)

// SimKinds lists every kind, the bad ones in the order they are chosen.
var SimKinds = []string{SimValid, SimMalformedJSON, SimMissingField, SimUnknownMix, SimBadCountry}

// Simulated end_reason values (the partner API does not publish its codes).
const (
	EndFinished = 1 // the mix played to its end
	EndSeek     = 2 // the listener sought to another position
	EndPause    = 3 // the listener paused; playback resumes later at the same position
	EndStop     = 4 // the listener stopped mid-track
	EndSkip     = 5 // the listener skipped to the next track
)

// SimConfig configures a simulation run. Zero values take the defaults named
// in the comments.
type SimConfig struct {
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
	// 2024-01-01T00:00:00Z so that a seed alone fixes the events.
	StartMS int64
	// BatchSize is the messages per synchronous write; defaults to 2000.
	// BatchTimeout is kafka-go's Writer.BatchTimeout, set deliberately:
	// kafka-go's 1 s default would make every synchronous write wait a
	// second for a partition batch to fill. Defaults to 2 ms.
	BatchSize    int
	BatchTimeout time.Duration
	// Record, when set, receives one JSON line per message acknowledged by
	// Kafka: {"kind":…,"key":…,"value":…} (value as a string).
	Record io.Writer
	// TracerProvider makes one producer span per message, whose W3C trace
	// context goes into the message headers (as the Publisher does); defaults
	// to the global provider.
	TracerProvider trace.TracerProvider
}

// DefaultSimStartMS is 2024-01-01T00:00:00Z.
const DefaultSimStartMS = 1704067200000

func (c *SimConfig) setDefaults() {
	if c.Topic == "" {
		c.Topic = c.Kafka.Topics().Events
	}
	if c.Devices == 0 {
		c.Devices = 200
	}
	if c.Users == 0 {
		c.Users = max(1, c.Devices*4/5)
	}
	if c.StartMS == 0 {
		c.StartMS = DefaultSimStartMS
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
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
}

func (c *SimConfig) validateGen() error {
	switch {
	case len(c.Mixes) == 0:
		return errors.New("producer: SimConfig.Mixes is empty: the simulator needs a catalog (--mixes or the partner API)")
	case c.Events < 1:
		return fmt.Errorf("producer: SimConfig.Events (--events) must be ≥ 1, got %d", c.Events)
	case c.Devices < 1:
		return fmt.Errorf("producer: SimConfig.Devices (--devices) must be ≥ 1, got %d", c.Devices)
	case c.Users < 1:
		return fmt.Errorf("producer: SimConfig.Users (--users) must be ≥ 1, got %d", c.Users)
	case !(c.BadShare >= 0 && c.BadShare <= 1):
		return fmt.Errorf("producer: SimConfig.BadShare (--bad-share) must be within 0–1, got %v", c.BadShare)
	case c.Rate < 0:
		return fmt.Errorf("producer: SimConfig.Rate (--rate) must be ≥ 0 (0: unlimited), got %v", c.Rate)
	}
	for _, m := range c.Mixes {
		if m.LengthMS < 1000 {
			return fmt.Errorf("producer: SimConfig.Mixes: mix %d is %d ms long; at least 1 s is required", m.ID, m.LengthMS)
		}
	}
	return nil
}

func (c *SimConfig) validate() error {
	if err := c.validateGen(); err != nil {
		return err
	}
	switch {
	case len(c.Kafka.Brokers) == 0:
		return errors.New("producer: SimConfig.Kafka.Brokers is empty; at least one host:port is required")
	case c.BatchSize < 1:
		return fmt.Errorf("producer: SimConfig.BatchSize must be ≥ 1, got %d", c.BatchSize)
	case c.BatchTimeout < 0:
		return fmt.Errorf("producer: SimConfig.BatchTimeout must be ≥ 0, got %s", c.BatchTimeout)
	}
	if err := c.Kafka.Validate(); err != nil {
		return fmt.Errorf("producer: %w", err)
	}
	return nil
}

// SimMessage is one message of the simulation.
type SimMessage struct {
	Kind  string
	Key   []byte
	Value []byte
}

// SimStats tells what a run sent (acknowledged by Kafka).
type SimStats struct {
	Sent    int
	ByKind  map[string]int
	Elapsed time.Duration
}

func (s SimStats) String() string {
	var b strings.Builder
	rate := 0.0
	if s.Elapsed > 0 {
		rate = float64(s.Sent) / s.Elapsed.Seconds()
	}
	fmt.Fprintf(&b, "sent %d events in %s (%.0f/s):", s.Sent, s.Elapsed.Round(time.Millisecond), rate)
	for _, k := range SimKinds {
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

// SimGenerator produces the simulation's messages, deterministically for a
// seed. Not safe for concurrent use.
type SimGenerator struct {
	cfg      SimConfig
	rng      *rand.Rand
	mixes    []simMix
	devices  []simDevice
	unknown  int64 // first mix id above every catalog id
	produced int
}

// NewSimGenerator validates the generation settings of cfg (Kafka settings
// are not needed) and returns a generator.
func NewSimGenerator(cfg SimConfig) (*SimGenerator, error) {
	cfg.setDefaults()
	if err := cfg.validateGen(); err != nil {
		return nil, err
	}
	g := &SimGenerator{cfg: cfg, rng: rand.New(rand.NewPCG(uint64(cfg.Seed), 0x706c61797069706))}
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
func (g *SimGenerator) Next() (m SimMessage, ok bool) {
	if g.produced >= g.cfg.Events {
		return SimMessage{}, false
	}
	g.produced++
	d := &g.devices[g.rng.IntN(len(g.devices))]
	ev := g.segment(d)
	kind := SimValid
	if g.cfg.BadShare > 0 && g.rng.Float64() < g.cfg.BadShare {
		kind = SimKinds[1+g.rng.IntN(len(SimKinds)-1)]
	}
	return g.encode(kind, d, ev), true
}

// segment advances device d by one listening segment and returns its event.
func (g *SimGenerator) segment(d *simDevice) schemas.PlayerEvent {
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
	var dur int64
	var end int64
	next := int64(-1) // the position of the next segment, -1: the session ends
	jump := false
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
	ev.DurationMS = dur
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

// part is a segment length within remaining: mostly tens of seconds to minutes,
// sometimes under a second.
func (g *SimGenerator) part(remaining int64) int64 {
	var d int64
	if g.rng.IntN(20) == 0 {
		d = 1 + g.rng.Int64N(1500)
	} else {
		d = 5000 + g.rng.Int64N(15*60_000)
	}
	return max(1, min(d, remaining))
}

// zipf picks an index in [0, n) with a skew towards the first ones (popular mixes).
func (g *SimGenerator) zipf(n int) int {
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

func (g *SimGenerator) encode(kind string, d *simDevice, ev schemas.PlayerEvent) SimMessage {
	valid, _ := json.Marshal(&ev)
	m := SimMessage{Kind: kind, Key: []byte(ev.EventID), Value: valid}
	switch kind {
	case SimUnknownMix:
		ev.MixID = g.unknown + g.rng.Int64N(1_000_000)
		m.Value, _ = json.Marshal(&ev)
	case SimBadCountry:
		ev.Country = simBadCountries[g.rng.IntN(len(simBadCountries))]
		m.Value, _ = json.Marshal(&ev)
	case SimMissingField:
		var obj map[string]json.RawMessage
		_ = json.Unmarshal(valid, &obj)
		drop := simRequiredDrops[g.rng.IntN(len(simRequiredDrops))]
		delete(obj, drop)
		m.Value, _ = json.Marshal(obj)
		if drop == "event_id" {
			m.Key = []byte(d.id)
		}
	case SimMalformedJSON:
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

// Simulate sends cfg.Events messages to the events topic through
// segmentio/kafka-go (synchronous batches, murmur2 key partitioning like
// franz-go and the Java client) and returns what Kafka acknowledged. It stops
// early when ctx ends, returning the stats so far and ctx's error.
func Simulate(ctx context.Context, cfg SimConfig) (stats SimStats, err error) {
	cfg.setDefaults()
	stats = SimStats{ByKind: map[string]int{}}
	if err := cfg.validate(); err != nil {
		return stats, err
	}
	gen, err := NewSimGenerator(cfg)
	if err != nil {
		return stats, err
	}
	transport, err := kafkaGoTransport(cfg.Kafka)
	if err != nil {
		return stats, err
	}
	w := &kafka.Writer{
		Addr:         kafka.TCP(cfg.Kafka.Brokers...),
		Topic:        cfg.Topic,
		Balancer:     &kafka.Murmur2Balancer{},
		BatchSize:    cfg.BatchSize,
		BatchBytes:   16 << 20,
		BatchTimeout: cfg.BatchTimeout,
		RequiredAcks: kafka.RequireAll,
		Transport:    transport,
	}
	defer w.Close()
	chunk := cfg.BatchSize
	var lim *rate.Limiter
	if cfg.Rate > 0 {
		chunk = max(1, min(chunk, int(cfg.Rate/20))) // ~20 writes a second keep the pace smooth
		lim = rate.NewLimiter(rate.Limit(cfg.Rate), chunk)
	}
	start := time.Now()
	defer func() { stats.Elapsed = time.Since(start) }()
	msgs := make([]kafka.Message, 0, chunk)
	kinds := make([]string, 0, chunk)
	var rec *json.Encoder
	if cfg.Record != nil {
		rec = json.NewEncoder(cfg.Record)
	}
	tracer := cfg.TracerProvider.Tracer(instrumentation)
	prop := otel.GetTextMapPropagator()
	spans := make([]trace.Span, 0, chunk)
	endSpans := func(err error) {
		for _, sp := range spans {
			if err != nil {
				sp.RecordError(err)
				sp.SetStatus(codes.Error, "not published")
			}
			sp.End()
		}
		spans = spans[:0]
	}
	defer func() { endSpans(err) }()
	for {
		msgs, kinds = msgs[:0], kinds[:0]
		for len(msgs) < chunk {
			m, ok := gen.Next()
			if !ok {
				break
			}
			sctx, span := tracer.Start(ctx, "send "+cfg.Topic, trace.WithSpanKind(trace.SpanKindProducer))
			msg := kafka.Message{Key: m.Key, Value: m.Value}
			prop.Inject(sctx, messageCarrier{&msg})
			spans = append(spans, span)
			msgs = append(msgs, msg)
			kinds = append(kinds, m.Kind)
		}
		if len(msgs) == 0 {
			return stats, nil
		}
		if lim != nil {
			if err := lim.WaitN(ctx, len(msgs)); err != nil {
				return stats, fmt.Errorf("producer: simulate: %w", ctxErr(ctx, err))
			}
		}
		if err := w.WriteMessages(ctx, msgs...); err != nil {
			if ctx.Err() != nil {
				err = ctx.Err()
			}
			return stats, fmt.Errorf("producer: simulate: write to %s after %d events: %w", cfg.Topic, stats.Sent, err)
		}
		endSpans(nil)
		for i, m := range msgs {
			stats.Sent++
			stats.ByKind[kinds[i]]++
			if rec != nil {
				if err := rec.Encode(simRecord{Kind: kinds[i], Key: string(m.Key), Value: string(m.Value)}); err != nil {
					return stats, fmt.Errorf("producer: simulate: record: %w", err)
				}
			}
		}
	}
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// messageCarrier is a propagation.TextMapCarrier over a kafka-go message's headers.
type messageCarrier struct{ m *kafka.Message }

func (c messageCarrier) Get(key string) string {
	for _, h := range c.m.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

func (c messageCarrier) Set(key, value string) {
	for i, h := range c.m.Headers {
		if h.Key == key {
			c.m.Headers[i].Value = []byte(value)
			return
		}
	}
	c.m.Headers = append(c.m.Headers, kafka.Header{Key: key, Value: []byte(value)})
}

func (c messageCarrier) Keys() []string {
	keys := make([]string, len(c.m.Headers))
	for i, h := range c.m.Headers {
		keys[i] = h.Key
	}
	return keys
}

// simRecord is one line of SimConfig.Record.
type simRecord struct {
	Kind  string `json:"kind"`
	Key   string `json:"key"`
	Value string `json:"value"`
}

// kafkaGoTransport builds kafka-go's transport from the shared Kafka settings
// (SASL, TLS), mirroring kafkax.Config.ClientOpts for franz-go.
func kafkaGoTransport(c kafkax.Config) (*kafka.Transport, error) {
	t := &kafka.Transport{ClientID: "playpipe-simulate", DialTimeout: 10 * time.Second}
	var mech sasl.Mechanism
	switch strings.ToUpper(c.SASLMechanism) {
	case kafkax.SASLNone:
	case kafkax.SASLPlain:
		mech = plain.Mechanism{Username: c.SASLUser, Password: c.SASLPassword}
	default:
		// kafka-go's SCRAM needs a module this build does not carry; the
		// pipeline's own clients (franz-go) support SCRAM.
		return nil, fmt.Errorf("producer: simulate supports --kafka-sasl PLAIN or none, not %q", c.SASLMechanism)
	}
	t.SASL = mech
	if c.TLS {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.TLSInsecure} //nolint:gosec // opt-in for tests
		if c.TLSCAFile != "" {
			pem, err := os.ReadFile(c.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("producer: read --kafka-ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("producer: --kafka-ca %s holds no PEM certificate", c.TLSCAFile)
			}
			tc.RootCAs = pool
		}
		t.TLS = tc
	}
	return t, nil
}
