package sandbox

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
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
// endpoint's 500 envelope otherwise. A faulted 429 carries the envelope
// with "too many requests". A faulted 401 is the plain-text "Unauthorized"
// of the authentication layer; 502 and 504 are plain-text gateway errors.
// Payload faults of play reports may also answer 400 (the validation
// envelope naming trackid) and 413 (the body-too-large envelope).
//
// Play reports: every fault is decided after the body is read, and every
// report answered with an injected status is kept in the ledger's
// injected list (LedgerSnapshot.Injected), never as accepted.
type Faults struct {
	Session GroupFaults `json:"session"`
	Catalog GroupFaults `json:"catalog"` // catalog, restricted catalog, page, list, genre row
	Mix     GroupFaults `json:"mix"`
	Report  GroupFaults `json:"report"`
	// Seed seeds the rate draws. The k-th request of a group that reaches
	// the rates gets the same verdict for the same seed and rates, so a run
	// that posts in the same order is reproduced exactly, and the share of
	// a rate over N requests is the same from run to run. Setting the
	// faults (or a reset) restarts the sequence.
	Seed uint64 `json:"seed"`
}

// GroupFaults are the faults of one endpoint group.
type GroupFaults struct {
	// Rate500 is the probability (0–1) that a request is answered 500.
	Rate500 float64 `json:"rate_500"`
	// Rate503 is the probability (0–1) that a request is answered 503.
	Rate503 float64 `json:"rate_503"`
	// Rate429 is the probability (0–1) that a request is answered 429.
	// One draw per request decides among the three rates, so each is the
	// share of the group's requests it gets; their sum must not exceed 1.
	Rate429 float64 `json:"rate_429,omitempty"`
	// RetryAfter, when positive, is sent as Retry-After (whole seconds,
	// rounded up) with every injected 429 and 503 of the group. In JSON: a
	// Go duration string ("2s") or nanoseconds.
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	// Latency is added before the request is handled (after the edge
	// layer); the wait ends early if the client goes away. It is
	// independent of every other fault. In JSON: a Go duration string
	// ("250ms") or nanoseconds.
	Latency time.Duration `json:"latency"`
	// FailNext answers the next FailNext requests of the group with
	// FailNextStatus, before the rates are drawn.
	FailNext int `json:"fail_next"`
	// FailNextStatus is the status of FailNext: 401, 429, 500 (the default
	// when 0), 502, 503 or 504.
	FailNextStatus int `json:"fail_next_status"`
	// IDs, when set, restrict FailNext and the rates to the requests for
	// these path ids (mix, page, list or genre row ids): e.g. one mix
	// failing while the others are served. Latency applies to all. Play
	// reports have no path id: use TrackIDs.
	IDs []int64 `json:"ids,omitempty"`

	// TrackIDs (report group only): every play report whose trackid is one
	// of these is answered TrackStatus (after Hold, when set; or its
	// connection reset, with HoldReset), until the faults are changed.
	TrackIDs []int64 `json:"track_ids,omitempty"`
	// TrackStatus is the status of TrackIDs: 400, 401, 413, 429, 500 (the
	// default when 0), 502, 503 or 504.
	TrackStatus int `json:"track_status,omitempty"`
	// BodyOver (report group only), when positive: every play report whose
	// body is longer than BodyOver bytes is answered BodyOverStatus. Bodies
	// over Config.MaxBodyBytes get the server's own 413 before any fault.
	BodyOver int64 `json:"body_over,omitempty"`
	// BodyOverStatus is the status of BodyOver; accepted as TrackStatus,
	// 413 (the default when 0).
	BodyOverStatus int `json:"body_over_status,omitempty"`

	// Hold (report group only), when positive, is how long a held play
	// report waits before its answer: the reports of TrackIDs (a partner
	// that hangs on one payload, the way an upstream timeout behind its
	// gateway looks) and the HoldRate share of the others. The wait ends
	// early if the client goes away. In JSON: a Go duration string ("45s")
	// or nanoseconds.
	Hold time.Duration `json:"hold,omitempty"`
	// HoldRate (report group only) is the probability (0–1) that a play
	// report not of TrackIDs is held Hold, then answered HoldStatus: a
	// partner that hangs on a share of all posts at random. Its own seeded
	// draw, independent of the rates'.
	HoldRate float64 `json:"hold_rate,omitempty"`
	// HoldStatus is the answer after the hold of a HoldRate report:
	// accepted as TrackStatus, 500 (the default when 0).
	HoldStatus int `json:"hold_status,omitempty"`
	// HoldReset resets the connection (HTTP/2: the stream) of a held
	// report, and of a report of TrackIDs, instead of answering: no status
	// at all (after Hold, when set).
	HoldReset bool `json:"hold_reset,omitempty"`
}

// isZero reports whether g injects nothing.
func (g *GroupFaults) isZero() bool {
	return g.Rate500 == 0 && g.Rate503 == 0 && g.Rate429 == 0 && g.Latency == 0 && g.FailNext == 0 &&
		g.FailNextStatus == 0 && len(g.IDs) == 0 && len(g.TrackIDs) == 0 && g.BodyOver == 0 && g.HoldRate == 0
}

// applies reports whether the faults of g apply to a request for path id.
func (g *GroupFaults) applies(id string) bool {
	if len(g.IDs) == 0 {
		return true
	}
	n, err := strconv.ParseInt(id, 10, 64)
	return err == nil && slices.Contains(g.IDs, n)
}

// MarshalJSON writes Latency, RetryAfter and Hold as Go duration strings.
func (g GroupFaults) MarshalJSON() ([]byte, error) {
	type plain GroupFaults
	var ra, hold string
	if g.RetryAfter != 0 {
		ra = g.RetryAfter.String()
	}
	if g.Hold != 0 {
		hold = g.Hold.String()
	}
	return json.Marshal(struct {
		plain
		Latency    string `json:"latency"`
		RetryAfter string `json:"retry_after,omitempty"`
		Hold       string `json:"hold,omitempty"`
	}{plain(g), g.Latency.String(), ra, hold})
}

// UnmarshalJSON reads Latency, RetryAfter and Hold as Go duration strings or
// nanoseconds, and refuses unknown fields.
func (g *GroupFaults) UnmarshalJSON(b []byte) error {
	type plain GroupFaults
	var aux struct {
		plain
		Latency    json.RawMessage `json:"latency"`
		RetryAfter json.RawMessage `json:"retry_after"`
		Hold       json.RawMessage `json:"hold"`
	}
	// Strict: a misspelt fault ("rate500") must not be dropped silently.
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&aux); err != nil {
		return err
	}
	*g = GroupFaults(aux.plain)
	var err error
	if g.Latency, err = jsonDuration(aux.Latency); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	if g.RetryAfter, err = jsonDuration(aux.RetryAfter); err != nil {
		return fmt.Errorf("retry_after: %w", err)
	}
	if g.Hold, err = jsonDuration(aux.Hold); err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	return nil
}

// jsonDuration reads a Go duration string or integer nanoseconds (absent
// or null: 0).
func jsonDuration(raw json.RawMessage) (time.Duration, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return time.ParseDuration(s)
	}
	var n int64
	if err := json.Unmarshal(raw, &n); err != nil {
		return 0, fmt.Errorf("a duration string or integer nanoseconds: %w", err)
	}
	return time.Duration(n), nil
}

// failStatus reports whether st is accepted as a fail_next_status (0: the default).
func failStatus(st int) bool {
	switch st {
	case 0, 401, 429, 500, 502, 503, 504:
		return true
	}
	return false
}

// payloadStatus reports whether st is accepted as a track_status or
// body_over_status (0: the default).
func payloadStatus(st int) bool { return failStatus(st) || st == 400 || st == 413 }

// Validate reports the first invalid field, named group.field.
func (f Faults) Validate() error {
	for g, gf := range f.groups() {
		name := Group(g).String()
		switch {
		case gf.Rate500 < 0 || gf.Rate500 > 1:
			return fmt.Errorf("%s.rate_500: accepted 0–1, got %v", name, gf.Rate500)
		case gf.Rate503 < 0 || gf.Rate503 > 1:
			return fmt.Errorf("%s.rate_503: accepted 0–1, got %v", name, gf.Rate503)
		case gf.Rate429 < 0 || gf.Rate429 > 1:
			return fmt.Errorf("%s.rate_429: accepted 0–1, got %v", name, gf.Rate429)
		case gf.Rate500+gf.Rate503+gf.Rate429 > 1+1e-9:
			return fmt.Errorf("%s: rate_500 + rate_503 + rate_429 must not exceed 1, got %v", name, gf.Rate500+gf.Rate503+gf.Rate429)
		case gf.Latency < 0 || gf.Latency > 5*time.Minute:
			return fmt.Errorf("%s.latency: accepted 0–5m, got %v", name, gf.Latency)
		case gf.RetryAfter < 0 || gf.RetryAfter > time.Hour:
			return fmt.Errorf("%s.retry_after: accepted 0–1h, got %v", name, gf.RetryAfter)
		case gf.FailNext < 0:
			return fmt.Errorf("%s.fail_next: must not be negative, got %d", name, gf.FailNext)
		case !failStatus(gf.FailNextStatus):
			return fmt.Errorf("%s.fail_next_status: accepted 401, 429, 500, 502, 503, 504, got %d", name, gf.FailNextStatus)
		case Group(g) != GroupReport && (len(gf.TrackIDs) > 0 || gf.TrackStatus != 0 || gf.BodyOver != 0 || gf.BodyOverStatus != 0 ||
			gf.Hold != 0 || gf.HoldRate != 0 || gf.HoldStatus != 0 || gf.HoldReset):
			return fmt.Errorf("%s: track_ids, track_status, body_over, body_over_status and the hold faults apply to the report group only", name)
		case gf.Hold < 0 || gf.Hold > maxHold:
			return fmt.Errorf("%s.hold: accepted 0–%v, got %v", name, maxHold, gf.Hold)
		case gf.HoldRate < 0 || gf.HoldRate > 1:
			return fmt.Errorf("%s.hold_rate: accepted 0–1, got %v", name, gf.HoldRate)
		case !payloadStatus(gf.HoldStatus):
			return fmt.Errorf("%s.hold_status: accepted 400, 401, 413, 429, 500, 502, 503, 504, got %d", name, gf.HoldStatus)
		case !payloadStatus(gf.TrackStatus):
			return fmt.Errorf("%s.track_status: accepted 400, 401, 413, 429, 500, 502, 503, 504, got %d", name, gf.TrackStatus)
		case !payloadStatus(gf.BodyOverStatus):
			return fmt.Errorf("%s.body_over_status: accepted 400, 401, 413, 429, 500, 502, 503, 504, got %d", name, gf.BodyOverStatus)
		case gf.BodyOver < 0:
			return fmt.Errorf("%s.body_over: must not be negative, got %d", name, gf.BodyOver)
		}
	}
	return nil
}

func (f Faults) groups() [numGroups]GroupFaults {
	return [numGroups]GroupFaults{f.Session, f.Catalog, f.Mix, f.Report}
}

// The kinds of injected answers (InjectedEntry.Fault).
const (
	FaultTrack    = "track"     // GroupFaults.TrackIDs
	FaultBodyOver = "body_over" // GroupFaults.BodyOver
	FaultFailNext = "fail_next" // GroupFaults.FailNext
	FaultRate     = "rate"      // GroupFaults.Rate500, Rate503, Rate429
	FaultHold     = "hold"      // GroupFaults.HoldRate
)

// maxHold bounds GroupFaults.Hold.
const maxHold = 10 * time.Minute

// faultState is the live fault configuration; FailNext counts down
// atomically and drawn numbers the rate draws of each group.
type faultState struct {
	cfg      Faults
	groups   [numGroups]GroupFaults
	failNext [numGroups]atomic.Int64
	drawn    [numGroups]atomic.Uint64
	held     atomic.Uint64      // the HoldRate draws
	tracks   map[int64]struct{} // the report group's TrackIDs
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
	if ids := f.Report.TrackIDs; len(ids) > 0 {
		st.tracks = make(map[int64]struct{}, len(ids))
		for _, id := range ids {
			st.tracks[id] = struct{}{}
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
	return Faults{Session: gs[0], Catalog: gs[1], Mix: gs[2], Report: gs[3], Seed: st.cfg.Seed}
}

// draw decides the fault status for one request of group g for path id
// (0: none), and the kind of fault that decided it.
func (st *faultState) draw(g Group, id string) (int, string) {
	gf := &st.groups[g]
	if !gf.applies(id) {
		return 0, ""
	}
	if st.failNext[g].Load() > 0 && st.failNext[g].Add(-1) >= 0 {
		return cmp.Or(gf.FailNextStatus, 500), FaultFailNext
	}
	if gf.Rate500 == 0 && gf.Rate503 == 0 && gf.Rate429 == 0 {
		return 0, ""
	}
	u := st.uniform(g)
	switch {
	case u < gf.Rate500:
		return 500, FaultRate
	case u < gf.Rate500+gf.Rate503:
		return 503, FaultRate
	case u < gf.Rate500+gf.Rate503+gf.Rate429:
		return 429, FaultRate
	}
	return 0, ""
}

// verdict is the fault decided for one play report: its status (0: none),
// the kind of fault, how long it is held first, and whether the connection
// is reset instead of answered.
type verdict struct {
	status int
	kind   string
	hold   time.Duration
	reset  bool
}

// drawReport decides the fault of one play report with this body: the
// payload faults (body size, then track id, held Hold first when set), then
// the held share, then fail_next and the rates.
func (st *faultState) drawReport(body []byte) verdict {
	gf := &st.groups[GroupReport]
	if gf.BodyOver > 0 && int64(len(body)) > gf.BodyOver {
		return verdict{status: cmp.Or(gf.BodyOverStatus, 413), kind: FaultBodyOver}
	}
	if st.tracks != nil {
		if id, ok := reportTrackID(body); ok {
			if _, hit := st.tracks[id]; hit {
				return verdict{status: cmp.Or(gf.TrackStatus, 500), kind: FaultTrack, hold: gf.Hold, reset: gf.HoldReset}
			}
		}
	}
	if gf.HoldRate > 0 && gf.Hold > 0 && st.uniformHold() < gf.HoldRate {
		return verdict{status: cmp.Or(gf.HoldStatus, 500), kind: FaultHold, hold: gf.Hold, reset: gf.HoldReset}
	}
	s, kind := st.draw(GroupReport, "")
	return verdict{status: s, kind: kind}
}

// uniformHold is the next number in [0, 1) of the HoldRate draws: a
// sequence of its own (seeded like uniform's), so that a held share leaves
// the rates' verdicts as they were.
func (st *faultState) uniformHold() float64 {
	return splitMix(st.cfg.Seed + 0x632BE59BD9B4E019 + st.held.Add(1)*0x9E3779B97F4A7C15)
}

// reportTrackID is the trackid of a play report body (the last one when
// repeated), false when the body is not valid JSON or has no integer trackid.
func reportTrackID(body []byte) (int64, bool) {
	if !json.Valid(body) {
		return 0, false
	}
	var raw string
	var seen bool
	scanObject(string(body), func(key, val string) {
		if key == "trackid" {
			raw, seen = val, true
		}
	})
	if !seen {
		return 0, false
	}
	return jsonInt(raw)
}

// uniform is the next number in [0, 1) of group g's seeded sequence:
// SplitMix64 of the seed, the group and the draw's number, so that
// concurrent draws need no lock and the k-th draw is always the same.
func (st *faultState) uniform(g Group) float64 {
	n := st.drawn[g].Add(1)
	return splitMix(st.cfg.Seed + uint64(g+1)*0xD1B54A32D192ED03 + n*0x9E3779B97F4A7C15)
}

// splitMix is SplitMix64's finaliser of z as a number in [0, 1).
func splitMix(z uint64) float64 {
	z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
	z = (z ^ z>>27) * 0x94D049BB133111EB
	z ^= z >> 31
	return float64(z>>11) / (1 << 53)
}

// clamp makes f valid for SetFaults, which has no error to return.
func (f Faults) clamp() Faults {
	c := func(g GroupFaults, report bool) GroupFaults {
		g.Rate500 = min(max(g.Rate500, 0), 1)
		g.Rate503 = min(max(g.Rate503, 0), 1)
		g.Rate429 = min(max(g.Rate429, 0), 1)
		g.Latency = min(max(g.Latency, 0), 5*time.Minute)
		g.RetryAfter = min(max(g.RetryAfter, 0), time.Hour)
		g.FailNext = max(g.FailNext, 0)
		g.BodyOver = max(g.BodyOver, 0)
		g.Hold = min(max(g.Hold, 0), maxHold)
		g.HoldRate = min(max(g.HoldRate, 0), 1)
		if !payloadStatus(g.HoldStatus) {
			g.HoldStatus = 500
		}
		if !failStatus(g.FailNextStatus) {
			g.FailNextStatus = 500
		}
		if !payloadStatus(g.TrackStatus) {
			g.TrackStatus = 500
		}
		if !payloadStatus(g.BodyOverStatus) {
			g.BodyOverStatus = 413
		}
		if !report {
			g.TrackIDs, g.TrackStatus, g.BodyOver, g.BodyOverStatus = nil, 0, 0, 0
			g.Hold, g.HoldRate, g.HoldStatus, g.HoldReset = 0, 0, 0, false
		}
		return g
	}
	return Faults{Session: c(f.Session, false), Catalog: c(f.Catalog, false), Mix: c(f.Mix, false), Report: c(f.Report, true), Seed: f.Seed}
}

// retryAfterHeader is the Retry-After value of d: whole seconds, rounded up.
func retryAfterHeader(d time.Duration) string {
	return strconv.FormatInt(int64((d+time.Second-1)/time.Second), 10)
}
