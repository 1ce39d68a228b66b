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
	if s.c.storm > 0 {
		if !waitFor(ctx, func() bool { return s.progress() >= s.c.stormAt || s.idle() }) {
			return
		}
		s.sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: s.c.stormRate}})
		at := s.progress()
		s.say("500 storm begins (%.0f%% of play reports) at %.0f%% of the events", s.c.stormRate*100, at*100)
		acc0, t0 := s.sb.Counts().Accepted, time.Now()
		// At least 20 reports accepted during the storm: with a 30 % rate the
		// chance that none of the posts around them was answered 500 is ~0.
		ok := waitFor(ctx, func() bool {
			return (time.Since(t0) >= s.c.storm && s.sb.Counts().Accepted-acc0 >= 20) || s.idle()
		})
		s.sb.SetFaults(sandbox.Faults{})
		if !ok {
			return
		}
		s.mu.Lock()
		s.stormAnswers = s.sb.Counts().Accepted - acc0
		s.mu.Unlock()
		s.say("500 storm over after %s (%d reports accepted during it)", time.Since(t0).Round(100*time.Millisecond), s.stormAnswers)
	}
	if s.c.standby > 0 {
		if !waitFor(ctx, func() bool { return s.progress() >= s.c.standbyAt || s.idle() }) {
			return
		}
		s.sb.SetMode(sandbox.ModeStandby)
		s.say("failover to STANDBY (reports answered 200 but not forwarded) at %.0f%% of the events", s.progress()*100)
		sb0, t0 := s.sb.Counts().Standby, time.Now()
		ok := waitFor(ctx, func() bool {
			return (time.Since(t0) >= s.c.standby && s.sb.Counts().Standby-sb0 >= 1) || s.idle()
		})
		s.sb.SetMode(sandbox.ModeLive)
		if !ok {
			return
		}
		s.mu.Lock()
		s.standbyAns = s.sb.Counts().Standby - sb0
		s.mu.Unlock()
		s.say("live service is back after %s (%d reports answered by standby, to be replayed)", time.Since(t0).Round(100*time.Millisecond), s.standbyAns)
	}
}
