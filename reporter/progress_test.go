package reporter

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

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
		p.Doubt = append(p.Doubt, p.Base+r.Int64N(span+1))
	}
	slices.Sort(p.Doubt)
	p.Doubt = slices.Compact(p.Doubt)
	return p
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
			cases = append(cases, randomProgress(r, span, share, r.IntN(DefaultConcurrency)))
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
		var span int64
		if n := len(p.Done); n > 0 {
			span = p.Done[n-1] - p.Base + 1
		}
		if max := progressSize(span, len(p.Doubt)); len(meta) > max {
			t.Errorf("encoded %d bytes, over the bound %d (span %d, doubts %d)", len(meta), max, span, len(p.Doubt))
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
	r := rand.New(rand.NewPCG(3, 4))
	storm := randomProgress(r, DefaultMaxPending, 0.7, DefaultConcurrency)
	meta := encodeProgress(storm)
	if len(meta) > DefaultMetadataMaxBytes {
		t.Errorf("a storm's progress over %d offsets takes %d bytes, over %d", DefaultMaxPending, len(meta), DefaultMetadataMaxBytes)
	}
	t.Logf("progress of %d offsets, 70%% final at random, %d in doubt: %d bytes", DefaultMaxPending, len(storm.Doubt), len(meta))
	if err := (Config{Kafka: kafkax.Config{Partitions: 1}}).Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
	if err := (Config{Kafka: kafkax.Config{Partitions: 1}, MaxPending: 60000}).Validate(); err == nil || !strings.Contains(err.Error(), "--max-pending") || !strings.Contains(err.Error(), "offset-metadata-max-bytes") {
		t.Errorf("MaxPending over what the metadata holds: got %v, want an error naming --max-pending and --offset-metadata-max-bytes", err)
	}
	if err := (Config{Kafka: kafkax.Config{Partitions: 1}, MaxPending: 60000, MetadataMaxBytes: 16384}).Validate(); err != nil {
		t.Errorf("a larger metadata bound allows more pending: %v", err)
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
