//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// Kind is one kind of fault.
type Kind string

// The fault kinds. Each has a group: two faults of one group never overlap
// (one broker fault at a time, one change of the partner's rates at a time,
// …); faults of different groups overlap freely.
const (
	KindKill9      Kind = "kill9"      // kill -9 of a role instance
	KindTerm       Kind = "term"       // SIGTERM of a role instance
	KindBroker     Kind = "broker"     // kill -9 of a broker, restarted after For
	KindLeader     Kind = "leader"     // kill -9 of the leader of the busiest plays.reports partition
	KindController Kind = "controller" // kill -9 of the active controller
	KindPartition  Kind = "partition"  // node 3 cut off silently (nftables drop in its namespace)
	KindStorm      Kind = "storm"      // the partner answers a share of reports 500, 503 or 429 (Retry-After)
	KindStandby    Kind = "standby"    // the partner in standby
	KindRevoke     Kind = "revoke"     // every session token revoked (instant)
	KindTrack500   Kind = "track500"   // one track's reports answered 500
	KindHang       Kind = "hang"       // one track's reports held past the reporter's timeout
	KindLatency    Kind = "latency"    // a latency step on every report
	KindScaleOut   Kind = "scaleout"   // a third reporter for a while
	KindScaleIn    Kind = "scalein"    // one reporter stopped for a while
	KindCHSlow     Kind = "chslow"     // clickhouse-server stopped (SIGSTOP) for a few seconds
)

// kindSpec says how a kind is drawn: its exclusion group, and the range of
// its duration (0 for an instant fault).
type kindSpec struct {
	group    string
	min, max time.Duration
}

var kinds = map[Kind]kindSpec{
	KindKill9:      {"role", 0, 0},
	KindTerm:       {"role", 0, 0},
	KindBroker:     {"kafka", 10 * time.Second, 40 * time.Second},
	KindLeader:     {"kafka", 10 * time.Second, 40 * time.Second},
	KindController: {"kafka", 10 * time.Second, 40 * time.Second},
	KindPartition:  {"kafka", 15 * time.Second, 45 * time.Second},
	KindStorm:      {"partner-rates", 10 * time.Second, 40 * time.Second},
	KindStandby:    {"partner-mode", 10 * time.Second, 30 * time.Second},
	KindRevoke:     {"partner-revoke", 0, 0},
	KindTrack500:   {"partner-track", 20 * time.Second, 60 * time.Second},
	KindHang:       {"partner-track", 20 * time.Second, 60 * time.Second},
	KindLatency:    {"partner-latency", 10 * time.Second, 40 * time.Second},
	KindScaleOut:   {"scale", 30 * time.Second, 90 * time.Second},
	KindScaleIn:    {"scale", 20 * time.Second, 60 * time.Second},
	KindCHSlow:     {"clickhouse", 3 * time.Second, 15 * time.Second},
}

// AllKinds in a fixed order (the draw depends on it).
var AllKinds = []Kind{KindKill9, KindTerm, KindBroker, KindLeader, KindController, KindPartition, KindStorm, KindStandby,
	KindRevoke, KindTrack500, KindHang, KindLatency, KindScaleOut, KindScaleIn, KindCHSlow}

// partnerKinds are the faults of the partner: while one is active the
// partner is not "reachable" for the stall figure.
var partnerKinds = []Kind{KindStorm, KindStandby, KindTrack500, KindHang, KindLatency}

// Roles whose instances kill9 and term pick from (the scaled reporter,
// report-2, is not among them: it runs only during a scale-out).
var faultRoles = []string{"consume-0", "consume-1", "report-0", "report-1", "sink", "ingest"}

// Fault is one planned fault: what, when (from the schedule's start), for
// how long, and its drawn parameters. Target and Param are resolved when it
// starts where they depend on the cluster (the leader, the controller).
type Fault struct {
	ID     int           `json:"id"`
	Kind   Kind          `json:"kind"`
	At     time.Duration `json:"at"`
	For    time.Duration `json:"for"`
	Target string        `json:"target,omitempty"`
	// Param is the drawn parameter: the status and share of a storm, the
	// latency of a step, a random number picking the track.
	Param string `json:"param,omitempty"`
	Pick  uint32 `json:"pick,omitempty"`
}

// Plan draws the schedule for seed over total: arrivals every meanGap on
// average (exponential), each of a kind drawn uniformly from enabled, with
// its duration and parameters; a kind whose group is busy at that moment
// is replaced by another draw (or the arrival dropped). Every fault ends by
// total. The same seed, total and kinds give the same schedule.
func Plan(seed int64, total, meanGap time.Duration, enabled []Kind) []Fault {
	r := rand.New(rand.NewPCG(uint64(seed), 0x636861_6f73))
	busy := map[string]time.Duration{} // group → end of its last fault
	var out []Fault
	t := 5 * time.Second
	for {
		t += time.Duration(r.ExpFloat64() * float64(meanGap))
		if t >= total-5*time.Second || len(enabled) == 0 {
			return out
		}
		for try := 0; try < 4; try++ {
			k := enabled[r.IntN(len(enabled))]
			spec := kinds[k]
			f := Fault{ID: len(out) + 1, Kind: k, At: t.Round(100 * time.Millisecond)}
			if spec.max > 0 {
				f.For = spec.min + time.Duration(r.Int64N(int64(spec.max-spec.min)))
				f.For = min(f.For, total-f.At).Round(100 * time.Millisecond)
			}
			group := spec.group
			switch k {
			case KindKill9, KindTerm:
				f.Target = faultRoles[r.IntN(len(faultRoles))]
				group = "role:" + f.Target
			case KindBroker:
				f.Target = fmt.Sprintf("node-%d", 1+r.IntN(3))
			case KindPartition:
				f.Target = "node-3"
			case KindStorm:
				f.Param = []string{"500", "503", "429"}[r.IntN(3)] + fmt.Sprintf("@%.2f", 0.3+0.6*r.Float64())
			case KindLatency:
				f.Param = []string{"100ms", "300ms", "1s", "2s"}[r.IntN(4)]
			case KindTrack500, KindHang:
				f.Pick = r.Uint32()
			case KindScaleOut:
				f.Target = "report-2"
			case KindScaleIn:
				f.Target = "report-1"
			case KindCHSlow:
				f.Target = "clickhouse"
			}
			if busy[group] > f.At {
				continue
			}
			// a role's instance is left alone while a scale-in stops it
			if (k == KindKill9 || k == KindTerm) && f.Target == "report-1" && busy["scale"] > f.At {
				continue
			}
			hold := max(f.For, 10*time.Second)
			if group == "kafka" {
				hold += 30 * time.Second // a killed node's restart and catch-up
			}
			busy[group] = f.At + hold
			out = append(out, f)
			break
		}
	}
}

// ParseKinds reads a comma-separated list of kinds ("" → none).
func ParseKinds(s string) ([]Kind, error) {
	var out []Kind
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if _, ok := kinds[Kind(p)]; !ok {
			return nil, fmt.Errorf("unknown fault kind %q (kinds: %v)", p, AllKinds)
		}
		out = append(out, Kind(p))
	}
	return out, nil
}

// Enabled is AllKinds less exclude.
func Enabled(exclude []Kind) []Kind {
	var out []Kind
	for _, k := range AllKinds {
		if !slices.Contains(exclude, k) {
			out = append(out, k)
		}
	}
	return out
}

// Timeline records each fault's start and end, as JSON lines, in a file
// and in memory (for the verdict).
type Timeline struct {
	t0 time.Time
	mu sync.Mutex
	f  *os.File
	// records by fault id
	recs map[int]*Record
}

// Record is one fault as it happened.
type Record struct {
	Fault
	Start time.Time `json:"start"`
	End   time.Time `json:"end,omitzero"`
	Note  string    `json:"note,omitempty"`
}

// line is one line of the timeline file.
type line struct {
	Event string  `json:"event"` // start, end, exit (a role's, restarted), or a phase: schedule, lifted, fleet-halted, drained
	Time  string  `json:"time"`
	T     float64 `json:"t"` // seconds since the schedule began
	Kind  Kind    `json:"kind,omitempty"`
	ID    int     `json:"id,omitempty"`
	For   string  `json:"for,omitempty"`
	Tgt   string  `json:"target,omitempty"`
	Param string  `json:"param,omitempty"`
	Note  string  `json:"note,omitempty"`
}

func newTimeline(path string, t0 time.Time) (*Timeline, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("timeline: %w", err)
	}
	return &Timeline{t0: t0, f: f, recs: map[int]*Record{}}, nil
}

func (tl *Timeline) write(l line, at time.Time) {
	l.Time = at.UTC().Format(time.RFC3339Nano)
	l.T = at.Sub(tl.t0).Round(time.Millisecond).Seconds()
	b, _ := json.Marshal(l)
	_, _ = tl.f.Write(append(b, '\n'))
}

// Phase records a phase of the run (setup done, schedule over, …).
func (tl *Timeline) Phase(name, note string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.write(line{Event: name, Note: note}, time.Now())
}

// Exit records that a role's instance exited (the supervisor restarts it).
func (tl *Timeline) Exit(name, how string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.write(line{Event: "exit", Tgt: name, Note: how}, time.Now())
}

// Started records that f began, with its resolved target and a note.
func (tl *Timeline) Started(f Fault, note string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	now := time.Now()
	tl.recs[f.ID] = &Record{Fault: f, Start: now, Note: note}
	tl.write(line{Event: "start", ID: f.ID, Kind: f.Kind, For: f.For.String(), Tgt: f.Target, Param: f.Param, Note: note}, now)
}

// Ended records that f ended (an instant fault ends when it starts).
func (tl *Timeline) Ended(f Fault, note string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	now := time.Now()
	if r := tl.recs[f.ID]; r != nil {
		r.End = now
		if note != "" {
			r.Note = strings.TrimPrefix(r.Note+"; "+note, "; ")
		}
	}
	tl.write(line{Event: "end", ID: f.ID, Kind: f.Kind, Tgt: f.Target, Note: note}, now)
}

// Records returns the faults as they happened, by start.
func (tl *Timeline) Records() []Record {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	var out []Record
	for _, r := range tl.recs {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b Record) int { return a.Start.Compare(b.Start) })
	return out
}

// Around returns the faults active at some time in [from, to].
func (tl *Timeline) Around(from, to time.Time) []Record {
	var out []Record
	for _, r := range tl.Records() {
		end := r.End
		if end.IsZero() {
			end = time.Now()
		}
		if !r.Start.After(to) && !end.Before(from) {
			out = append(out, r)
		}
	}
	return out
}

// PartnerFaultAt reports whether a fault of the partner was active at t.
func (tl *Timeline) PartnerFaultAt(t time.Time) bool {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	for _, r := range tl.recs {
		if !slices.Contains(partnerKinds, r.Kind) {
			continue
		}
		if !r.Start.After(t) && (r.End.IsZero() || !r.End.Before(t)) {
			return true
		}
	}
	return false
}

func (tl *Timeline) Close() error { return tl.f.Close() }
