package reporter

import (
	"encoding/base64"
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/internal/kafkax"
)

func sameProgress(a, b *progress) bool {
	return a.Base == b.Base && a.LogPartition == b.LogPartition && a.LogOffset == b.LogOffset &&
		slices.Equal(a.Done, b.Done) && slices.Equal(a.Doubt, b.Doubt)
}

// randomProgress builds a progress over span offsets with the given share of
// final ones, and a few in doubt.
func randomProgress(r *rand.Rand, span int64, share float64, doubts int) *progress {
	p := &progress{Base: r.Int64N(1 << 40), LogPartition: r.Int32N(64), LogOffset: r.Int64N(1 << 40)}
	for i := range span {
		if r.Float64() < share {
			p.Done = append(p.Done, p.Base+i)
		}
	}
	for range doubts {
		o := p.Base + r.Int64N(span+1)
		if _, done := slices.BinarySearch(p.Done, o); !done {
			p.Doubt = append(p.Doubt, o)
		}
	}
	slices.Sort(p.Doubt)
	p.Doubt = slices.Compact(p.Doubt)
	return p
}

// spanOf is the span the encoder covers: up to the last done or doubt offset.
func spanOf(p *progress) int64 {
	var span int64
	if n := len(p.Done); n > 0 {
		span = p.Done[n-1] - p.Base + 1
	}
	if n := len(p.Doubt); n > 0 {
		span = max(span, p.Doubt[n-1]-p.Base+1)
	}
	return span
}

func TestProgressRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	cases := []*progress{
		{Base: 0},
		{Base: 42, LogPartition: 3, LogOffset: 7},
		{Base: 100, Done: []int64{100, 101, 102, 200}, Doubt: []int64{103, 150}},
		{Base: 5, Done: []int64{6}, Doubt: []int64{5}},
	}
	for _, share := range []float64{0, 0.01, 0.3, 0.7, 0.99, 1} {
		for _, span := range []int64{1, 9, 1000, DefaultMaxPending} {
			cases = append(cases, randomProgress(r, span, share, r.IntN(MaxInFlight)))
		}
	}
	for _, p := range cases {
		meta := encodeProgress(p)
		got, err := decodeProgress(meta, p.Base)
		if err != nil {
			t.Fatalf("decode %q: %v", meta, err)
		}
		if !sameProgress(p, got) {
			t.Fatalf("round trip changed the progress:\n have %+v\n got  %+v", p, got)
		}
		span := spanOf(p)
		if max := progressSize(span); len(meta) > max {
			t.Errorf("encoded %d bytes, over the bound %d (span %d, doubts %d)", len(meta), max, span, len(p.Doubt))
		}
		// Commits of earlier versions (format 1) still decode.
		if got, err := decodeProgress(encodeProgressV1(p), p.Base); err != nil || !sameProgress(p, got) {
			t.Fatalf("format 1 does not decode: %v", err)
		}
	}
}

// TestProgressEncodingChoice: contiguous finals are a few bytes of runs; a
// storm's random pattern falls back to the bitset, and the default bounds
// always fit Kafka's default offset.metadata.max.bytes.
func TestProgressEncodingChoice(t *testing.T) {
	p := &progress{Base: 1000}
	for o := int64(1010); o < 11000; o++ {
		p.Done = append(p.Done, o)
	}
	if meta := encodeProgress(p); len(meta) > 32 {
		t.Errorf("a contiguous run of 10k finals takes %d bytes: %q", len(meta), meta)
	}
	// The window: the worst case (states at random over the whole window)
	// fits Kafka's default offset.metadata.max.bytes; one more offset may not.
	w := progressWindow(DefaultMetadataMaxBytes)
	if w < 15000 {
		t.Errorf("progress window of %d bytes: %d offsets, want ≥ 15 000", DefaultMetadataMaxBytes, w)
	}
	r := rand.New(rand.NewPCG(3, 4))
	for _, share := range []float64{0.3, 0.5, 0.7} {
		storm := randomProgress(r, w-1, share, int(w)/3)
		storm.Done = append(storm.Done, storm.Base+w-1) // the span is the whole window
		meta := encodeProgress(storm)
		if len(meta) > DefaultMetadataMaxBytes {
			t.Errorf("progress over the window (%d offsets, %d done, %d in doubt) takes %d bytes, over %d", w, len(storm.Done), len(storm.Doubt), len(meta), DefaultMetadataMaxBytes)
		}
		t.Logf("progress of %d offsets, %d done, %d in doubt at random: %d bytes", w, len(storm.Done), len(storm.Doubt), len(meta))
	}
	if progressSize(w+5) <= DefaultMetadataMaxBytes {
		t.Errorf("progressWindow(%d) = %d is not the largest window", DefaultMetadataMaxBytes, w)
	}
	if err := (Config{Kafka: kafkax.Config{Partitions: 1}}).Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
	// Any in-flight up to MaxInFlight on Kafka's default metadata bound.
	if err := (Config{Kafka: kafkax.Config{Partitions: 1}, Concurrency: MaxInFlight}).Validate(); err != nil {
		t.Errorf("--concurrency %d on the default metadata bound: %v", MaxInFlight, err)
	}
	if err := (Config{Kafka: kafkax.Config{Partitions: 1}, Concurrency: 1024, MetadataMaxBytes: 256}).Validate(); err == nil || !strings.Contains(err.Error(), "offset-metadata-max-bytes") {
		t.Errorf("a metadata bound that holds less than the in-flight: got %v, want an error naming --offset-metadata-max-bytes", err)
	}
}

func TestProgressForeignAndCorrupt(t *testing.T) {
	for _, meta := range []string{"", "consumer-1-abc", "pp0.AAAA"} {
		if _, err := decodeProgress(meta, 0); err != errNoProgress {
			t.Errorf("decodeProgress(%q) = %v, want errNoProgress", meta, err)
		}
	}
	good := encodeProgress(&progress{Base: 10, Done: []int64{11, 12}, Doubt: []int64{13}})
	for _, meta := range []string{progressPrefix + "!!", progressPrefix + "Ag", good + "AA", good[:len(good)-2]} {
		if _, err := decodeProgress(meta, 10); err == nil {
			t.Errorf("decodeProgress(%q) accepted corrupt metadata", meta)
		}
	}
}

// FuzzDecodeProgress: no input panics or yields a progress that does not
// encode back to an equivalent one.
func FuzzDecodeProgress(f *testing.F) {
	f.Add(encodeProgress(&progress{Base: 100, Done: []int64{100, 101, 102, 200}, Doubt: []int64{103, 150}}), int64(100))
	f.Add(encodeProgress(randomProgress(rand.New(rand.NewPCG(5, 6)), 300, 0.6, 4)), int64(0))
	f.Add(progressPrefix+"AQAAAAA", int64(0))
	f.Fuzz(func(t *testing.T, meta string, base int64) {
		if base < 0 || base > 1<<50 {
			return
		}
		p, err := decodeProgress(meta, base)
		if err != nil {
			return
		}
		// Format 1 allowed an offset in both sets, and repeated doubts:
		// done wins, as in recovery.
		p.Doubt = slices.Compact(slices.DeleteFunc(p.Doubt, func(o int64) bool { _, done := slices.BinarySearch(p.Done, o); return done }))
		again, err := decodeProgress(encodeProgress(p), base)
		if err != nil || !sameProgress(p, again) {
			t.Fatalf("decoded progress does not survive a round trip: %+v → %+v (%v)", p, again, err)
		}
	})
}

func TestParseSource(t *testing.T) {
	for _, c := range []struct {
		in    string
		p     int32
		o     int64
		flags string
		ok    bool
	}{
		{"3:12345:f", 3, 12345, "f", true},
		{"0:0:-", 0, 0, "-", true},
		{"11:7:d", 11, 7, "d", true},
		{"3:12345", 0, 0, "", false},
		{"x:1:f", 0, 0, "", false},
		{"", 0, 0, "", false},
	} {
		p, o, flags, ok := parseSource([]byte(c.in))
		if ok != c.ok || (ok && (p != c.p || o != c.o || string(flags) != c.flags)) {
			t.Errorf("parseSource(%q) = %d %d %q %v", c.in, p, o, flags, ok)
		}
	}
}

// encodeProgressV1 is the format-1 encoder of earlier versions (Done as runs
// or a bitset, Doubt as deltas), kept to check that their commits still
// decode after an upgrade.
func encodeProgressV1(p *progress) string {
	b := make([]byte, 0, 64)
	b = append(b, 1) // format version
	b = binary.AppendUvarint(b, uint64(p.LogPartition))
	b = binary.AppendUvarint(b, uint64(p.LogOffset))
	var span int64
	if n := len(p.Done); n > 0 {
		span = p.Done[n-1] - p.Base + 1
	}
	b = binary.AppendUvarint(b, uint64(span))
	runs := appendRunsV1(nil, p.Base, p.Done)
	if bitsetLen := (span + 7) / 8; int64(len(runs)) <= bitsetLen {
		b = append(b, encRuns)
		b = binary.AppendUvarint(b, uint64(len(runs)))
		b = append(b, runs...)
	} else {
		b = append(b, encBitset)
		bits := make([]byte, bitsetLen)
		for _, o := range p.Done {
			i := o - p.Base
			bits[i/8] |= 1 << (i % 8)
		}
		b = append(b, bits...)
	}
	b = binary.AppendUvarint(b, uint64(len(p.Doubt)))
	prev := p.Base
	for _, o := range p.Doubt {
		b = binary.AppendUvarint(b, uint64(o-prev))
		prev = o
	}
	return progressPrefix + base64.RawURLEncoding.EncodeToString(b)
}
func appendRunsV1(dst []byte, base int64, done []int64) []byte {
	next := base // first offset not yet covered by a run
	for i := 0; i < len(done); {
		j := i + 1
		for j < len(done) && done[j] == done[j-1]+1 {
			j++
		}
		dst = binary.AppendUvarint(dst, uint64(done[i]-next))
		dst = binary.AppendUvarint(dst, uint64(j-i))
		next = done[j-1] + 1
		i = j
	}
	return dst
}

// TestProgressV1CorruptRunReturns: a corrupt format-1 progress whose run
// fails its bounds check (or whose span is absurd) is an error at once.
// Before, the decoder went on to expand the run it had just found outside
// the span: up to 2^40 offsets appended to Done, a decode that never
// returned (and ate the memory) on a recovery's path.
func TestProgressV1CorruptRunReturns(t *testing.T) {
	v1 := func(span, gap, run uint64) string {
		var runs []byte
		runs = binary.AppendUvarint(runs, gap)
		runs = binary.AppendUvarint(runs, run)
		b := []byte{1}                    // format version
		b = binary.AppendUvarint(b, 0)    // log partition
		b = binary.AppendUvarint(b, 7)    // log offset
		b = binary.AppendUvarint(b, span) // span
		b = append(b, encRuns)
		b = binary.AppendUvarint(b, uint64(len(runs)))
		b = append(b, runs...)
		b = binary.AppendUvarint(b, 0) // no doubt
		return progressPrefix + base64.RawURLEncoding.EncodeToString(b)
	}
	for _, c := range []struct {
		name           string
		span, gap, run uint64
	}{
		// The run ends one past the span: its check fails, and the old
		// decoder still appended its 2^40 offsets.
		{"run past a 2^40 span", 1 << 40, 1, 1 << 40},
		{"run past the span", 1 << 20, 1, 1 << 20},
		// Within its own bounds but absurd: 2^40 offsets past the commit
		// point are no window any version leased within.
		{"2^40 span", 1 << 40, 0, 1 << 40},
	} {
		t.Run(c.name, func(t *testing.T) {
			meta := v1(c.span, c.gap, c.run)
			done := make(chan error, 1)
			go func() { // left running if it does not return: the test fails, the process ends
				_, err := decodeProgress(meta, 100)
				done <- err
			}()
			select {
			case err := <-done:
				if err == nil {
					t.Fatalf("decodeProgress(%q) accepted a corrupt format-1 run", meta)
				}
				t.Logf("decodeProgress: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatalf("decodeProgress(%q) did not return within 10 s", meta)
			}
		})
	}
	// A well-formed format-1 progress still decodes.
	p := &progress{Base: 100, LogOffset: 7, Done: []int64{101, 102, 103, 200}, Doubt: []int64{104}}
	got, err := decodeProgress(encodeProgressV1(p), 100)
	if err != nil || !sameProgress(p, got) {
		t.Fatalf("format 1 round trip: %+v, %v", got, err)
	}
}
