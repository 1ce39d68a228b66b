package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/playpipe/playpipe/partnerapi/sandbox"
)

// demoSchedule drives the sandbox's 500 storm and standby window by progress:
// each opens when the consumer has gone through its share of the events and
// closes when it has lasted its least duration and the partner API answered
// reports during it — so both overlap traffic on a fast or a slow machine —
// or when nothing is left to deliver (idle).
type demoSchedule struct {
	c        demoConfig
	sb       *sandbox.Server
	out      io.Writer
	start    time.Time
	progress func() float64 // share of the events through the consumer
	idle     func() bool    // fleet done, ledger drained
	finished atomic.Bool

	mu           sync.Mutex
	stormAnswers int64 // reports accepted while the storm was on
	standbyAns   int64 // reports answered by standby during the window
	notes        []string
}

func (s *demoSchedule) done() bool { return s.finished.Load() }

func (s *demoSchedule) summary() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.notes) == 0 {
		return "none happened yet"
	}
	return strings.Join(s.notes, "; ")
}

func (s *demoSchedule) say(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.mu.Lock()
	s.notes = append(s.notes, msg)
	s.mu.Unlock()
	fmt.Fprintf(s.out, "%6.1fs  >>> partner API: %s\n", time.Since(s.start).Seconds(), msg)
}

// waitFor polls cond until it holds (true) or ctx ends (false).
func waitFor(ctx context.Context, cond func() bool) bool {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
	return true
}

func (s *demoSchedule) run(ctx context.Context) {
	defer s.finished.Store(true)
	if s.c.storm > 0 && !s.incident(ctx, incident{
		at: s.c.stormAt, least: s.c.storm,
		// At least 20 reports accepted during the storm: with a 30 % rate the
		// chance that none of the posts around them was answered 500 is ~0.
		min: 20, count: func() int64 { return s.sb.Counts().Accepted },
		begin: func() {
			s.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: s.c.stormRate}})
			s.say("500 storm begins (%.0f%% of play reports) at %.0f%% of the events", s.c.stormRate*100, s.progress()*100)
		},
		end:  func() { s.sb.SetFaults(sandbox.Faults{}) },
		rose: &s.stormAnswers, over: "500 storm over after %s (%d reports accepted during it)",
	}) {
		return
	}
	if s.c.standby > 0 {
		s.incident(ctx, incident{
			at: s.c.standbyAt, least: s.c.standby,
			min: 1, count: func() int64 { return s.sb.Counts().Standby },
			begin: func() {
				s.sb.SetMode(sandbox.ModeStandby)
				s.say("failover to STANDBY (reports answered 200 but not forwarded) at %.0f%% of the events", s.progress()*100)
			},
			end:  func() { s.sb.SetMode(sandbox.ModeLive) },
			rose: &s.standbyAns, over: "live service is back after %s (%d reports answered by standby, to be replayed)",
		})
	}
}

// incident is one partner API incident of the demo: it begins once the
// consumer is through share at of the events and ends when it has lasted
// least and count rose by min (or when the demo is idle).
type incident struct {
	at         float64
	least      time.Duration
	min        int64
	count      func() int64
	begin, end func()
	rose       *int64 // where the rise of count during it is kept (under mu)
	over       string // the note when it ends: format of its duration and rise
}

// incident runs in: waits for its start, begins it, waits for its end, ends
// it, then keeps and says how much count rose. It returns false when ctx
// ended first (end is still called if begin was).
func (s *demoSchedule) incident(ctx context.Context, in incident) bool {
	if !waitFor(ctx, func() bool { return s.progress() >= in.at || s.idle() }) {
		return false
	}
	// The count is read before the incident begins: a report answered in
	// the instant after begin (a reporter stops posting at its first standby
	// answer) must count as its rise, or the window never closes.
	c0 := in.count()
	in.begin()
	t0 := time.Now()
	ok := waitFor(ctx, func() bool {
		return (time.Since(t0) >= in.least && in.count()-c0 >= in.min) || s.idle()
	})
	in.end()
	if !ok {
		return false
	}
	s.mu.Lock()
	*in.rose = in.count() - c0
	n := *in.rose
	s.mu.Unlock()
	s.say(in.over, time.Since(t0).Round(100*time.Millisecond), n)
	return true
}
