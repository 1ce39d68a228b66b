package analytics

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// The partner, delay, replay and HTML parts of expect.

func parseLoc(s string) mLoc {
	topic, rest, _ := strings.Cut(s, "/")
	p, o, _ := strings.Cut(rest, "@")
	part, _ := strconv.Atoi(p)
	off, _ := strconv.ParseInt(o, 10, 64)
	return mLoc{topic, int32(part), off}
}

// expectPartners: per partner target, the distinct plays it delivered and
// its distinct answers; the reportable plays delivered only by sandboxes.
func (s *scenario) expectPartners(x *expectation, o AuditOptions) {
	type acc struct {
		plays   map[string]bool
		answers int
	}
	by := map[string]*acc{}
	for _, p := range x.plays {
		sandboxN, realN := 0, 0
		for _, d := range p.deliveries {
			c := by[d.partner]
			if c == nil {
				c = &acc{plays: map[string]bool{}}
				by[d.partner] = c
			}
			c.answers++
			if d.outcome == schemas.OutcomeDelivered {
				c.plays[p.reportID] = true
				if IsSandboxTarget(d.partner, o.SandboxTargets) {
					sandboxN++
				} else {
					realN++
				}
			}
		}
		if !p.below && sandboxN > 0 && realN == 0 {
			x.audit.DeliveredToSandbox++
		}
	}
	x.audit.ByPartner = []PartnerCount{}
	for _, partner := range slices.Sorted(mapKeys(by)) {
		c := by[partner]
		x.audit.ByPartner = append(x.audit.ByPartner, PartnerCount{Partner: partner, Sandbox: IsSandboxTarget(partner, o.SandboxTargets),
			Delivered: uint64(len(c.plays)), Answers: uint64(c.answers)})
	}
	x.audit.DeliveredReal = x.audit.Delivered - min(x.audit.Delivered, x.audit.DeliveredToSandbox)
}

// expectDelay: from the first record of a delivered play's event (any
// time: the earliest of its records in the ledger and of the event record
// times the play's window records carry) to its first `delivered` answer;
// quantileExact takes the element at ⌊level·n⌋ of the sorted delays.
func (s *scenario) expectDelay(x *expectation) {
	eventMS := map[string]int64{}
	for _, e := range s.events {
		if e.id == "" {
			continue
		}
		if ms, ok := eventMS[e.id]; !ok || int64(e.ms()) < ms {
			eventMS[e.id] = int64(e.ms())
		}
	}
	var delays []float64
	for _, p := range x.plays {
		ms, ok := eventMS[p.eventID]
		if p.carriedMS > 0 && (!ok || p.carriedMS < ms) {
			ms, ok = p.carriedMS, true
		}
		if !p.below && p.delivered() && ok {
			delays = append(delays, float64(p.deliveredMS-ms))
		}
	}
	slices.Sort(delays)
	d := Delay{Plays: uint64(len(delays))}
	if n := len(delays); n > 0 {
		q := func(level float64) float64 { return delays[min(n-1, int(level*float64(n)))] }
		d.P50MS, d.P90MS, d.P99MS, d.MaxMS = q(0.5), q(0.9), q(0.99), delays[n-1]
	}
	x.audit.Delay = d
}

// expectReplays: per replay id, the window's plays it answered, and the
// replay:<id> lists.
func (s *scenario) expectReplays(x *expectation) {
	type acc struct {
		rc           ReplayCount
		first, last  int64
		plays, del   map[string]bool
		rej          map[string]bool
		delRecords   int
		rows         map[string]*ListRow
		rowFirst     map[string]int64
		rowLast      map[string]int64
		rowTraces    map[string][]string
		rowDelivered map[string]int
	}
	by := map[string]*acc{}
	for _, p := range x.plays {
		for _, d := range p.deliveries {
			if d.replayID == "" {
				continue
			}
			c := by[d.replayID]
			if c == nil {
				c = &acc{rc: ReplayCount{ID: d.replayID, Reason: d.replayReason}, first: d.at, last: d.at,
					plays: map[string]bool{}, del: map[string]bool{}, rej: map[string]bool{}, rows: map[string]*ListRow{},
					rowFirst: map[string]int64{}, rowLast: map[string]int64{}, rowTraces: map[string][]string{}, rowDelivered: map[string]int{}}
				by[d.replayID] = c
			}
			c.first, c.last = min(c.first, d.at), max(c.last, d.at)
			c.plays[p.reportID] = true
			switch d.outcome {
			case schemas.OutcomeDelivered:
				c.del[p.reportID] = true
				c.delRecords++
				c.rowDelivered[p.reportID]++
			case schemas.OutcomeRejected:
				c.rej[p.reportID] = true
			}
			r := c.rows[p.reportID]
			if r == nil {
				r = &ListRow{ReportID: p.reportID, EventID: d.eventID}
				c.rows[p.reportID] = r
				c.rowFirst[p.reportID], c.rowLast[p.reportID] = d.at, d.at
				r.Detail = d.outcome
			}
			if d.at < c.rowFirst[p.reportID] {
				c.rowFirst[p.reportID] = d.at
			}
			if d.at > c.rowLast[p.reportID] {
				c.rowLast[p.reportID], r.Detail = d.at, d.outcome
			}
			c.rowTraces[p.reportID] = append(c.rowTraces[p.reportID], d.traceID)
		}
	}
	x.audit.Replays = []ReplayCount{}
	for _, c := range by {
		c.rc.Plays, c.rc.Delivered, c.rc.Rejected = uint64(len(c.plays)), uint64(len(c.del)), uint64(len(c.rej))
		c.rc.DeliveredTwice = uint64(c.delRecords - len(c.del))
		c.rc.First, c.rc.Last = time.UnixMilli(c.first).UTC(), time.UnixMilli(c.last).UTC()
		x.audit.Replays = append(x.audit.Replays, c.rc)
		var rows []ListRow
		for id, r := range c.rows {
			r.At = time.UnixMilli(c.rowFirst[id]).UTC()
			r.Delivered = uint64(c.rowDelivered[id])
			r.TraceIDs = uniq(c.rowTraces[id])
			rows = append(rows, *r)
		}
		slices.SortFunc(rows, func(p, q ListRow) int { return cmp.Or(p.At.Compare(q.At), cmp.Compare(p.ReportID, q.ReportID)) })
		x.lists[ReplayListPrefix+c.rc.ID] = rows
	}
	slices.SortFunc(x.audit.Replays, func(p, q ReplayCount) int { return cmp.Or(p.First.Compare(q.First), cmp.Compare(p.ID, q.ID)) })
}

// expectHTML: the page's time series of the reportable plays and its
// standby episodes.
func (s *scenario) expectHTML(x *expectation) {
	var lo, hi int64
	n := 0
	for _, p := range x.plays {
		if p.below {
			continue
		}
		end := int64(p.derivedMS)
		if p.anyDelivered {
			end = max(end, p.deliveredMS)
		} else {
			end = max(end, p.rejectedMS)
		}
		if n == 0 {
			lo, hi = int64(p.derivedMS), end
		}
		lo, hi = min(lo, int64(p.derivedMS)), max(hi, end)
		n++
	}
	if n > 0 {
		span := time.Duration(hi-lo) * time.Millisecond
		x.bucket = niceSteps[len(niceSteps)-1]
		for _, st := range niceSteps {
			if span/st <= 60 {
				x.bucket = st
				break
			}
		}
		b := x.bucket.Milliseconds()
		points := map[int64]*SeriesPoint{}
		at := func(ms int64) *SeriesPoint {
			k := ms / b * b
			if points[k] == nil {
				points[k] = &SeriesPoint{At: time.UnixMilli(k).UTC()}
			}
			return points[k]
		}
		for _, p := range x.plays {
			if p.below {
				continue
			}
			at(int64(p.derivedMS)).Derived++
			switch {
			case p.anyDelivered:
				at(p.deliveredMS).Delivered++
			case p.anyRejected:
				at(p.rejectedMS).Rejected++
			}
		}
		var derived, final uint64
		for _, k := range slices.Sorted(func(yield func(int64) bool) {
			for k := range points {
				if !yield(k) {
					return
				}
			}
		}) {
			pt := *points[k]
			derived += pt.Derived
			final += pt.Delivered + pt.Rejected
			if derived > final {
				pt.Pending = derived - final
			}
			x.series = append(x.series, pt)
		}
	}

	var standby []*mDelivery
	for _, p := range x.plays {
		for _, d := range p.deliveries {
			if d.outcome == schemas.OutcomeStandby {
				standby = append(standby, d)
			}
		}
	}
	slices.SortFunc(standby, func(p, q *mDelivery) int { return cmp.Compare(p.at, q.at) })
	var cur *StandbyEpisode
	var seen map[string]bool
	for _, d := range standby {
		at := time.UnixMilli(d.at).UTC()
		if cur == nil || at.Sub(cur.To) > EpisodeGap {
			x.episodes = append(x.episodes, StandbyEpisode{From: at, To: at})
			cur = &x.episodes[len(x.episodes)-1]
			seen = map[string]bool{}
		}
		cur.To = at
		cur.Answers++
		if !seen[d.reportID] {
			seen[d.reportID] = true
			cur.Reports++
		}
	}
}
