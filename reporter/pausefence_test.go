package reporter

import (
	"testing"
	"time"
)

// TestPauseWatch: the pause fence's verdicts. A watch that has not ticked
// for longer than its gap (the process resumes, the watch not yet run) and
// a gap seen since a slow retry began both say stalled, and the lane holds
// its slow retries until twice the gap after the pause; a watch ticking on
// time says neither.
func TestPauseWatch(t *testing.T) {
	w := newPauseWatch(6 * time.Second) // gap 3 s
	start := time.Now()
	if w.stalled(start) {
		t.Error("a watch ticking on time says stalled")
	}
	if _, held := w.holding(); held {
		t.Error("a watch ticking on time holds the lane")
	}
	w.last.Store(time.Now().Add(-10 * time.Second).UnixNano()) // resumed, not ticked yet
	if !w.stalled(start) {
		t.Error("a watch that has not ticked for 10 s does not say stalled")
	}
	if d, held := w.holding(); !held || d <= 0 {
		t.Errorf("a watch that has not ticked for 10 s: holding %v %v, want held", d, held)
	}
	now := time.Now()
	w.last.Store(now.UnixNano())
	w.end.Store(now.UnixNano()) // the tick after the pause saw the gap
	if !w.stalled(start) {
		t.Error("a gap seen after the slow retry began does not say stalled")
	}
	if w.stalled(now.Add(time.Millisecond)) {
		t.Error("a gap seen before the slow retry began says stalled")
	}
	if d, held := w.holding(); !held || d > 6*time.Second {
		t.Errorf("just after a pause: holding %v %v, want held for at most 6 s", d, held)
	}
	w.end.Store(now.Add(-7 * time.Second).UnixNano())
	if _, held := w.holding(); held {
		t.Error("7 s after a pause (gap 3 s) the lane still holds")
	}
}
