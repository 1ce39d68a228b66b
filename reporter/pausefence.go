package reporter

import (
	"sync/atomic"
	"time"
)

// A process paused (SIGSTOP, a frozen VM, a stop-the-world swap storm)
// longer than its group session loses its partitions without being told
// until it runs again: a slow retry under way then finishes its post and
// would write the report's parked state after the new owner's — bringing
// a delivered report back into <prefix>.parked. The revocation's wait for
// slow retries (checkRevocations) never sees such a loss. The pause fence
// narrows it: a watch notes every gap in this process's own run longer
// than pauseGap, and a slow retry that spans one records nothing (its
// answer unrecorded, the report parked and due again, its next post in
// doubt); for pauseHold after a gap the lane starts none, while the group
// tells this process what it lost.

// pauseWatch is the fence's state (run.paused).
type pauseWatch struct {
	last atomic.Int64 // Unix ns of the watch's last tick
	end  atomic.Int64 // Unix ns when the last gap was seen
	gap  time.Duration
}

// pauseTick is the watch's tick; pauseGap (the session timeout's half,
// at least a second) is the gap it takes for a pause.
const pauseTick = 100 * time.Millisecond

func newPauseWatch(sessionTimeout time.Duration) *pauseWatch {
	w := &pauseWatch{gap: max(sessionTimeout/2, time.Second)}
	w.last.Store(time.Now().UnixNano()) // real time on purpose: see watchPauses
	return w
}

// watchPauses ticks until the run ends (a goroutine of serve). Real time
// on purpose: it measures this process's own pauses, which an injected
// clock does not see.
func (rn *run) watchPauses() {
	t := time.NewTicker(pauseTick)
	defer t.Stop()
	for {
		select {
		case <-rn.coordDone:
			return
		case <-t.C:
		}
		now := time.Now()
		if d := now.Sub(time.Unix(0, rn.paused.last.Load())); d > rn.paused.gap {
			rn.paused.end.Store(now.UnixNano())
			rn.log.Warn("this process was paused: slow retries under way leave their answers unrecorded, and none starts while the group says what this process still owns",
				"paused_for", d.Round(time.Millisecond))
		}
		rn.paused.last.Store(now.UnixNano())
	}
}

// stalled reports whether this process may have been paused past its
// session since start: a gap seen since, or one under way (the watch has
// not ticked for longer than the gap: it has not run since the resume).
func (w *pauseWatch) stalled(start time.Time) bool {
	now := time.Now()
	return now.Sub(time.Unix(0, w.last.Load())) > w.gap || w.end.Load() >= start.UnixNano()
}

// holding reports whether the lane holds its slow retries after a gap
// (pauseHold: the session timeout, time for the group to say what this
// process lost), and for how long still.
func (w *pauseWatch) holding() (time.Duration, bool) {
	now := time.Now()
	if now.Sub(time.Unix(0, w.last.Load())) > w.gap {
		return 2 * w.gap, true
	}
	left := time.Unix(0, w.end.Load()).Add(2 * w.gap).Sub(now)
	return left, w.end.Load() != 0 && left > 0
}
