package sandbox

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// Group is an endpoint group that faults are configured for.
type Group int

const (
	// GroupSession: POST /partners/session and /partners/session/with-user.
	GroupSession Group = iota
	// GroupCatalog: catalog, restricted catalog, page, list and genre row.
	GroupCatalog
	// GroupMix: GET /partners/mix/{id}.
	GroupMix
	// GroupReport: POST /partners/royalty-tracking.
	GroupReport
	numGroups
)

var groupNames = [numGroups]string{"session", "catalog", "mix", "report"}

func (g Group) String() string {
	if g >= 0 && g < numGroups {
		return groupNames[g]
	}
	return fmt.Sprintf("group(%d)", int(g))
}

// Faults are the injected failures, per endpoint group. The zero value
// injects nothing. Faults apply to requests that passed the edge layer and
// (on data endpoints) the token check: they emulate a service that was
// reached and failed.
//
// A faulted 500 carries the endpoint's error envelope with reason (or, for
// play reports, message) "internal service error". A faulted 503 carries
// {"error":true,"reason":"standby upstream error"} in standby and the
// endpoint's 500 envelope otherwise. A faulted 401 is the plain-text
// "Unauthorized" of the authentication layer; 502 and 504 are plain-text
// gateway errors.
type Faults struct {
	Session GroupFaults `json:"session"`
	Catalog GroupFaults `json:"catalog"` // catalog, restricted catalog, page, list, genre row
	Mix     GroupFaults `json:"mix"`
	Report  GroupFaults `json:"report"`
}

// GroupFaults are the faults of one endpoint group.
type GroupFaults struct {
	// Rate500 is the probability (0–1) that a request is answered 500.
	Rate500 float64 `json:"rate_500"`
	// Rate503 is the probability (0–1) that a request is answered 503;
	// drawn after Rate500.
	Rate503 float64 `json:"rate_503"`
	// Latency is added before the request is handled (after the edge
	// layer); the wait ends early if the client goes away. In JSON: a Go
	// duration string ("250ms") or nanoseconds.
	Latency time.Duration `json:"latency"`
	// FailNext answers the next FailNext requests of the group with
	// FailNextStatus, before the rates are drawn.
	FailNext int `json:"fail_next"`
	// FailNextStatus is the status of FailNext: 401, 500 (the default when
	// 0), 502, 503 or 504.
	FailNextStatus int `json:"fail_next_status"`
	// IDs, when set, restrict FailNext and the rates to the requests for
	// these path ids (mix, page, list or genre row ids): e.g. one mix
	// failing while the others are served. Latency applies to all.
	IDs []int64 `json:"ids,omitempty"`
}

// isZero reports whether g injects nothing.
func (g *GroupFaults) isZero() bool {
	return g.Rate500 == 0 && g.Rate503 == 0 && g.Latency == 0 && g.FailNext == 0 && g.FailNextStatus == 0 && len(g.IDs) == 0
}

// applies reports whether the faults of g apply to a request for path id.
func (g *GroupFaults) applies(id string) bool {
	if len(g.IDs) == 0 {
		return true
	}
	n, err := strconv.ParseInt(id, 10, 64)
	return err == nil && slices.Contains(g.IDs, n)
}

// MarshalJSON writes Latency as a Go duration string.
func (g GroupFaults) MarshalJSON() ([]byte, error) {
	type plain GroupFaults
	return json.Marshal(struct {
		plain
		Latency string `json:"latency"`
	}{plain(g), g.Latency.String()})
}

// UnmarshalJSON reads Latency as a Go duration string or nanoseconds.
func (g *GroupFaults) UnmarshalJSON(b []byte) error {
	type plain GroupFaults
	var aux struct {
		plain
		Latency json.RawMessage `json:"latency"`
	}
	if err := json.Unmarshal(b, &aux); err != nil {
		return err
	}
	*g = GroupFaults(aux.plain)
	g.Latency = 0
	if len(aux.Latency) > 0 && string(aux.Latency) != "null" {
		var s string
		if json.Unmarshal(aux.Latency, &s) == nil {
			d, err := time.ParseDuration(s)
			if err != nil {
				return fmt.Errorf("latency: %w", err)
			}
			g.Latency = d
		} else {
			var n int64
			if err := json.Unmarshal(aux.Latency, &n); err != nil {
				return fmt.Errorf("latency: a duration string or integer nanoseconds: %w", err)
			}
			g.Latency = time.Duration(n)
		}
	}
	return nil
}

// Validate reports the first invalid field, named group.field.
func (f Faults) Validate() error {
	for g, gf := range f.groups() {
		name := Group(g).String()
		switch {
		case gf.Rate500 < 0 || gf.Rate500 > 1:
			return fmt.Errorf("%s.rate_500: accepted 0–1, got %v", name, gf.Rate500)
		case gf.Rate503 < 0 || gf.Rate503 > 1:
			return fmt.Errorf("%s.rate_503: accepted 0–1, got %v", name, gf.Rate503)
		case gf.Latency < 0 || gf.Latency > 5*time.Minute:
			return fmt.Errorf("%s.latency: accepted 0–5m, got %v", name, gf.Latency)
		case gf.FailNext < 0:
			return fmt.Errorf("%s.fail_next: must not be negative, got %d", name, gf.FailNext)
		}
		switch gf.FailNextStatus {
		case 0, 401, 500, 502, 503, 504:
		default:
			return fmt.Errorf("%s.fail_next_status: accepted 401, 500, 502, 503, 504, got %d", name, gf.FailNextStatus)
		}
	}
	return nil
}

func (f Faults) groups() [numGroups]GroupFaults {
	return [numGroups]GroupFaults{f.Session, f.Catalog, f.Mix, f.Report}
}

// faultState is the live fault configuration; FailNext counts down atomically.
type faultState struct {
	cfg      Faults
	groups   [numGroups]GroupFaults
	failNext [numGroups]atomic.Int64
	any      bool
}

func newFaultState(f Faults) *faultState {
	st := &faultState{cfg: f, groups: f.groups()}
	for g, gf := range st.groups {
		st.failNext[g].Store(int64(gf.FailNext))
		if !gf.isZero() {
			st.any = true
		}
	}
	return st
}

// current returns the configuration with FailNext as what remains.
func (st *faultState) current() Faults {
	gs := st.groups
	for g := range gs {
		gs[g].FailNext = int(max(st.failNext[g].Load(), 0))
	}
	return Faults{Session: gs[0], Catalog: gs[1], Mix: gs[2], Report: gs[3]}
}

// draw decides the fault status for one request of group g for path id
// (0: none).
func (st *faultState) draw(g Group, id string) int {
	gf := &st.groups[g]
	if !gf.applies(id) {
		return 0
	}
	if st.failNext[g].Load() > 0 && st.failNext[g].Add(-1) >= 0 {
		if gf.FailNextStatus == 0 {
			return 500
		}
		return gf.FailNextStatus
	}
	if gf.Rate500 > 0 && rand.Float64() < gf.Rate500 {
		return 500
	}
	if gf.Rate503 > 0 && rand.Float64() < gf.Rate503 {
		return 503
	}
	return 0
}

// clamp makes f valid for SetFaults, which has no error to return.
func (f Faults) clamp() Faults {
	c := func(g GroupFaults) GroupFaults {
		g.Rate500 = min(max(g.Rate500, 0), 1)
		g.Rate503 = min(max(g.Rate503, 0), 1)
		g.Latency = min(max(g.Latency, 0), 5*time.Minute)
		g.FailNext = max(g.FailNext, 0)
		switch g.FailNextStatus {
		case 0, 401, 500, 502, 503, 504:
		default:
			g.FailNextStatus = 500
		}
		return g
	}
	return Faults{Session: c(f.Session), Catalog: c(f.Catalog), Mix: c(f.Mix), Report: c(f.Report)}
}
