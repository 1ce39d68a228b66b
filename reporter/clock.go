package reporter

import "time"

// Clock is the reporter's time: every reading of the time and every timer
// of a Run goes through it (Config.Clock), so that tests advance time
// instead of sleeping. The timers it drives: the retry backoff and the
// retry budget's wake-up (the coordinator's retry timer), the periodic
// commit, the shutdown timeout, the standby probe interval and the rate
// limit's waits (--rate); the adaptive limit's intervals and the budget's
// refill read Now. A post's latency is the partner client's measurement
// (real time; dispatch.go measures it itself when the client did not).
// Waits on the broker (topics being created in intake.go, recovery
// retries in recover.go, the parked topic reader's idle limit in
// parkedtopic.go) stay on the real clock: they wait for another process,
// not for a timer of the reporter; so does the recovery's duration in its
// log line. Each of these says so where it stands.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once, d from Now.
	NewTimer(d time.Duration) Timer
}

// Timer is a Clock's one-shot timer (what *time.Timer does).
type Timer interface {
	// C delivers the time when the timer fires.
	C() <-chan time.Time
	// Reset makes the timer fire d from now; the timer must be stopped or
	// fired (Go 1.23 timer semantics: no stale value is delivered after).
	Reset(d time.Duration) bool
	// Stop keeps the timer from firing; it reports whether it was pending.
	Stop() bool
}

// systemClock is the real clock; now reads the time (time.Now, or the
// Config.Now of a caller that set only that).
type systemClock struct{ now func() time.Time }

func (c systemClock) Now() time.Time { return c.now() }

func (systemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time        { return t.t.C }
func (t sysTimer) Reset(d time.Duration) bool { return t.t.Reset(d) }
func (t sysTimer) Stop() bool                 { return t.t.Stop() }
