package reporter

import (
	"errors"
	"testing"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

func TestWatermark(t *testing.T) {
	var w watermark
	if _, _, ok := w.committable(); ok {
		t.Fatal("empty tracker must have nothing to commit")
	}
	// Offsets with a gap (a transaction marker at 3).
	offsets := []int64{0, 1, 2, 4, 5, 6}
	seqs := make([]uint64, len(offsets))
	for i, o := range offsets {
		seqs[i] = w.add(o, 7, 0)
	}
	if n := w.markDone(seqs[1]); n != 0 {
		t.Fatalf("done out of order popped %d", n)
	}
	if _, _, ok := w.committable(); ok {
		t.Fatal("commit point must not pass offset 0 while it is not final")
	}
	if n := w.markDone(seqs[0]); n != 2 {
		t.Fatalf("popped %d, want 2", n)
	}
	if o, ep, _ := w.committable(); o != 2 || ep != 7 {
		t.Fatalf("committable = %d/%d, want 2/7", o, ep)
	}
	w.markDone(seqs[3])
	w.markDone(seqs[5])
	if o, _, _ := w.committable(); o != 2 {
		t.Fatalf("committable = %d, want 2 (offset 2 pending)", o)
	}
	if w.pending() != 4 {
		t.Fatalf("pending = %d, want 4", w.pending())
	}
	w.markDone(seqs[2])
	if o, _, _ := w.committable(); o != 5 {
		t.Fatalf("committable = %d, want 5 (past offset 4)", o)
	}
	w.markDone(seqs[2]) // again: no-op
	w.markDone(seqs[4])
	if o, _, _ := w.committable(); o != 7 || w.pending() != 0 {
		t.Fatalf("committable = %d pending %d, want 7 and 0", o, w.pending())
	}
	// Many adds with a stuck head, then release: compaction keeps sequences right.
	head := w.add(7, 8, 0)
	var rest []uint64
	for o := int64(8); o < 5000; o++ {
		s := w.add(o, 8, 0)
		rest = append(rest, s)
		if o%3 == 0 {
			w.markDone(s)
		}
	}
	for _, s := range rest {
		w.markDone(s)
	}
	if o, _, _ := w.committable(); o != 7 {
		t.Fatalf("committable = %d, want 7 while offset 7 pending", o)
	}
	w.markDone(head)
	if o, ep, _ := w.committable(); o != 5000 || ep != 8 || w.pending() != 0 {
		t.Fatalf("committable = %d/%d pending %d, want 5000/8/0", o, ep, w.pending())
	}
	// Interleave adds and dones so compaction happens mid-stream.
	var ss []uint64
	for o := int64(5000); o < 6000; o++ {
		ss = append(ss, w.add(o, 9, 0))
		if len(ss) > 3 {
			w.markDone(ss[0])
			ss = ss[1:]
		}
	}
	for _, s := range ss {
		w.markDone(s)
	}
	if o, _, _ := w.committable(); o != 6000 {
		t.Fatalf("committable = %d, want 6000", o)
	}
}

func TestRecentSet(t *testing.T) {
	s := newRecentSet(3)
	ids := []string{schemas.ReportID("e1", 0), schemas.ReportID("e1", 1), "not-hex", schemas.ReportID("e2", 0)}
	for _, id := range ids[:3] {
		s.add(id)
	}
	for _, id := range ids[:3] {
		if !s.has(id) {
			t.Fatalf("missing %s", id)
		}
	}
	s.add(ids[3]) // evicts the oldest
	if s.has(ids[0]) || !s.has(ids[3]) || s.len() != 3 {
		t.Fatalf("eviction wrong: has0=%v has3=%v len=%d", s.has(ids[0]), s.has(ids[3]), s.len())
	}
	off := newRecentSet(-1)
	off.add("x")
	if off.has("x") {
		t.Fatal("a disabled set must remember nothing")
	}
}

func TestBackoff(t *testing.T) {
	b := retryPolicy(Config{BackoffInitial: 100 * time.Millisecond, BackoffMax: time.Second, RetryAfterMax: 5 * time.Second})
	for n := 1; n <= 10; n++ {
		step := min(100*time.Millisecond<<(n-1), time.Second)
		for range 50 {
			d := b.Delay(n, 0)
			if d < step/2 || d > step {
				t.Fatalf("delay(%d) = %v, want in [%v, %v]", n, d, step/2, step)
			}
		}
	}
	if d := b.Delay(1, 3*time.Second); d != 3*time.Second {
		t.Fatalf("Retry-After not honoured: %v", d)
	}
	if d := b.Delay(1, time.Hour); d != 5*time.Second {
		t.Fatalf("Retry-After not capped: %v", d)
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{}
	good.Kafka.Partitions = 1
	if err := good.Validate(); err != nil {
		t.Fatalf("defaults must be valid: %v", err)
	}
	bad := good
	bad.Concurrency = -1
	if err := bad.Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("want ErrInvalidConfig, got %v", err)
	}
	bad = good
	bad.MaxPending = 4
	if err := bad.Validate(); err == nil {
		t.Fatal("max-pending below concurrency must fail")
	}
	bad = good
	bad.Producers = -1
	if err := bad.Validate(); err == nil {
		t.Fatal("producers below 1 must fail")
	}
}
