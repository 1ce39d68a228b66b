package main

import (
	"flag"
	"fmt"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// timeWindowFlags are the plausible-time window flags, shared by consume
// and ingest (which must agree, as for the other event policies).
type timeWindowFlags struct {
	back, ahead time.Duration
	envErr      error // an environment default that does not parse
}

// register binds --time-window-back and --time-window-ahead (env
// PLAYPIPE_TIME_WINDOW_BACK, PLAYPIPE_TIME_WINDOW_AHEAD).
func (f *timeWindowFlags) register(fs *flag.FlagSet) {
	back, ahead := schemas.DefaultTimeBack, schemas.DefaultTimeAhead
	for _, e := range []struct {
		name string
		dst  *time.Duration
	}{{"PLAYPIPE_TIME_WINDOW_BACK", &back}, {"PLAYPIPE_TIME_WINDOW_AHEAD", &ahead}} {
		if v := envDefault(e.name, ""); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil && f.envErr == nil {
				f.envErr = fmt.Errorf("%s %q: accepted: a Go duration such as 720h", e.name, v)
			}
			*e.dst = d
		}
	}
	fs.DurationVar(&f.back, "time-window-back", back,
		"an event's started_at may lie this long before its arrival (the record's timestamp in consume, the request's time in ingest); older, or not epoch milliseconds, is rejected implausible_time (env PLAYPIPE_TIME_WINDOW_BACK)")
	fs.DurationVar(&f.ahead, "time-window-ahead", ahead,
		"an event's started_at, and its segment's end, may lie this long after its arrival; later is rejected implausible_time (env PLAYPIPE_TIME_WINDOW_AHEAD)")
}

// window returns the configured window; errors name the flag.
func (f *timeWindowFlags) window() (schemas.TimeWindow, error) {
	if f.envErr != nil {
		return schemas.TimeWindow{}, f.envErr
	}
	switch {
	case f.back <= 0:
		return schemas.TimeWindow{}, fmt.Errorf("--time-window-back must be > 0, got %s", f.back)
	case f.ahead <= 0:
		return schemas.TimeWindow{}, fmt.Errorf("--time-window-ahead must be > 0, got %s", f.ahead)
	}
	return schemas.TimeWindow{Back: f.back, Ahead: f.ahead}, nil
}
