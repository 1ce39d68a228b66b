package analytics

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/playpipe/playpipe/schemas"
)

// The audit of a scenario computed in Go from the scenario's facts, rule
// by rule as docs/audit.md states them, without SQL: what every backend's
// audit, lists and HTML page must equal.

// mPlayState is one play of the window with its outcomes (perReport's row).
type mPlayState struct {
	reportID, eventID         string
	below                     bool
	derivedMS                 uint64
	carriedMS                 int64 // earliest event record time its window records carry (0: none)
	deliveredN, replayDelN    int   // distinct `delivered` records, live / replays
	rejected, standby, doubt  bool
	parked                    bool   // answered parked at least once
	lastAnswer                string // the pending and parked lists' detail
	deliveredMS, rejectedMS   int64  // first delivered / rejected answer (0: none)
	lastOutcome, message      string
	traces, deliveredTraces   []string
	deliveries                []*mDelivery
	anyDelivered, anyRejected bool
	doubtN                    int      // live records with a doubt cause
	causes                    []string // their causes
	replayDoubtN              int      // replay records with a doubt cause
	replayCauses              []string // their causes
}

// copies bounds the play's copies at the partner (docs/audit.md, "Copies
// at the partner"): its live delivered records plus its posts whose fate
// is unknown (legacy: one when a delivered record says in_doubt), plus, for
// a play no live record delivered (parked, then redriven), its replay
// delivered records and replay posts whose fate is unknown.
func (p *mPlayState) copies() int {
	n := p.deliveredN + max(p.doubtN, b2int(p.doubt))
	if p.deliveredN == 0 {
		n += p.replayDelN + p.replayDoubtN
	}
	return n
}

// copyCauses are the causes of the posts copies counts.
func (p *mPlayState) copyCauses() []string {
	if p.deliveredN == 0 {
		return uniq(append(slices.Clone(p.causes), p.replayCauses...))
	}
	return uniq(p.causes)
}

func (p *mPlayState) delivered() bool { return p.deliveredN > 0 || p.replayDelN > 0 }
func (p *mPlayState) pending() bool   { return !p.below && !p.delivered() && !p.rejected }

type expectation struct {
	audit    Audit
	plays    []*mPlayState // ordered by derived time, report id
	lists    map[string][]ListRow
	bucket   time.Duration
	series   []SeriesPoint
	episodes []StandbyEpisode
}

func inWindow(r *mRec, o AuditOptions) bool {
	ms := int64(r.ms())
	return ms >= o.From.UnixMilli() && ms < o.To.UnixMilli()
}

// uniq returns the sorted distinct non-empty strings of xs ([] when none).
func uniq(xs []string) []string {
	out := []string{}
	for _, x := range xs {
		if x != "" && !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	sort.Strings(out)
	return out
}

// expect computes the audit of s for o (o.Now, o.PendingThreshold set).
func (s *scenario) expect(o AuditOptions) expectation {
	var x expectation
	a := &x.audit
	x.lists = map[string][]ListRow{}

	// Events: received, not JSON, refused at the gateway.
	var received, notJSON []ListRow
	for _, e := range s.events {
		if !inWindow(&e.mRec, o) {
			continue
		}
		a.EventsReceived++
		row := ListRow{EventID: e.id, At: e.ts.UTC(), Kafka: e.key().String()}
		if !e.parsed {
			a.EventsNotJSON++
			row.Detail = "not JSON"
			notJSON = append(notJSON, row)
		}
		received = append(received, row)
	}
	for _, j := range s.rejections {
		if j.src == nil && inWindow(&j.mRec, o) {
			a.EventsAtGateway++
			a.EventsReceived++
			received = append(received, ListRow{EventID: j.eventID, At: j.ts.UTC(), Detail: "refused at the ingest gateway: " + j.reason, Kafka: j.key().String()})
		}
	}
	byTimeLoc := func(rows []ListRow) []ListRow {
		slices.SortStableFunc(rows, func(p, q ListRow) int { return cmp.Or(p.At.Compare(q.At), cmpKafka(p.Kafka, q.Kafka)) })
		return rows
	}
	x.lists["received"], x.lists["not-json"] = byTimeLoc(received), byTimeLoc(notJSON)

	// Rejections: once per rejected event, offset_beyond_mix excepted.
	rejected := map[mLoc]*mRejection{}
	var rejs []*mRejection
	for _, j := range s.rejections {
		if j.reason != schemas.ReasonOffsetBeyondMix && inWindow(&j.mRec, o) {
			rejs = append(rejs, j)
		}
	}
	slices.SortStableFunc(rejs, func(p, q *mRejection) int {
		return cmp.Or(cmp.Compare(p.ms(), q.ms()), cmpLoc(p.srcLoc(), q.srcLoc()), cmpLoc(p.key(), q.key()))
	})
	byReason := map[string]uint64{}
	for _, j := range rejs {
		if _, seen := rejected[j.eventKey()]; seen {
			continue
		}
		rejected[j.eventKey()] = j
		byReason[j.reason]++
		x.lists["rejected"] = append(x.lists["rejected"], ListRow{EventID: j.eventID, At: j.ts.UTC(), Detail: j.reason, Kafka: j.eventKey().String()})
	}
	a.EventsRejected = uint64(len(rejected))
	a.RejectedByReason = sortedCounts(byReason)

	// Valid events of the window without a play (and not rejected).
	rejectedSrc := map[mLoc]bool{}
	for _, j := range s.rejections {
		if j.src != nil && j.reason != schemas.ReasonOffsetBeyondMix {
			rejectedSrc[j.src.key()] = true
		}
	}
	withPlays := map[string]bool{}
	for _, p := range s.plays {
		withPlays[p.eventID] = true
	}
	for _, e := range s.events {
		if inWindow(&e.mRec, o) && e.parsed && !rejectedSrc[e.key()] && !withPlays[e.id] {
			a.EventsWithoutPlays++
		}
	}

	// Plays of the window and their outcomes (any time).
	states := map[string]*mPlayState{}
	for _, p := range s.plays {
		if !inWindow(&p.mRec, o) {
			continue
		}
		a.PlayRecords++
		st := states[p.reportID]
		if st == nil {
			st = &mPlayState{reportID: p.reportID, eventID: p.eventID, derivedMS: p.ms()}
			states[p.reportID] = st
			x.plays = append(x.plays, st)
		}
		st.below = st.below || p.below
		st.derivedMS = min(st.derivedMS, p.ms())
		if p.eventAt > 0 && (st.carriedMS == 0 || p.eventAt < st.carriedMS) {
			st.carriedMS = p.eventAt
		}
	}
	slices.SortFunc(x.plays, func(p, q *mPlayState) int {
		return cmp.Or(cmp.Compare(p.derivedMS, q.derivedMS), cmp.Compare(p.reportID, q.reportID))
	})
	byCause := map[string]uint64{}
	for _, d := range s.deliveries {
		st := states[d.reportID]
		if st == nil {
			continue
		}
		st.deliveries = append(st.deliveries, d)
		if d.doubtCause != "" && d.replayID == "" {
			st.doubtN++
			st.causes = append(st.causes, d.doubtCause)
			byCause[d.doubtCause]++
		}
		if d.doubtCause != "" && d.replayID != "" {
			st.replayDoubtN++
			st.replayCauses = append(st.replayCauses, d.doubtCause)
		}
		switch d.outcome {
		case schemas.OutcomeDelivered:
			if d.replayID == "" {
				st.deliveredN++
				st.doubt = st.doubt || d.inDoubt
			} else {
				st.replayDelN++
			}
			if !st.anyDelivered || d.at < st.deliveredMS {
				st.deliveredMS = d.at
			}
			st.anyDelivered = true
			st.deliveredTraces = append(st.deliveredTraces, d.traceID)
		case schemas.OutcomeRejected:
			if !st.anyRejected || d.at < st.rejectedMS {
				st.rejectedMS = d.at
			}
			st.anyRejected, st.rejected, st.message = true, true, d.message
		case schemas.OutcomeStandby:
			st.standby = true
		case schemas.OutcomeParked:
			st.parked = true
		}
		st.traces = append(st.traces, d.traceID)
	}
	// A replay's posts in doubt of a play no live record delivered count
	// among the doubtful posts (copies).
	for _, st := range x.plays {
		if st.deliveredN == 0 {
			for _, c := range st.replayCauses {
				byCause[c]++
			}
		}
	}
	byMessage := map[string]uint64{}
	conds := map[string]func(p *mPlayState) bool{
		"derived":           func(*mPlayState) bool { return true },
		"below-minimum":     func(p *mPlayState) bool { return p.below },
		"reportable":        func(p *mPlayState) bool { return !p.below },
		"delivered":         func(p *mPlayState) bool { return !p.below && p.delivered() },
		"rejected-by-api":   func(p *mPlayState) bool { return !p.below && !p.delivered() && p.rejected },
		"standby":           func(p *mPlayState) bool { return !p.below && p.standby },
		"standby-delivered": func(p *mPlayState) bool { return !p.below && p.standby && p.delivered() },
		"pending":           func(p *mPlayState) bool { return p.pending() },
		"pending-overdue": func(p *mPlayState) bool {
			return p.pending() && int64(p.derivedMS) < o.Now.Add(-o.PendingThreshold).UnixMilli()
		},
		"parked":                  func(p *mPlayState) bool { return p.pending() && p.parked },
		"delivered-twice":         func(p *mPlayState) bool { return p.deliveredN > 1 },
		"possibly-twice":          func(p *mPlayState) bool { return !p.below && p.deliveredN == 1 && p.doubt },
		"below-minimum-delivered": func(p *mPlayState) bool { return p.below && p.delivered() },
		"extra-copies":            func(p *mPlayState) bool { return !p.below && p.copies() > 1 },
	}
	counters := map[string]*uint64{
		"derived": &a.PlaysDerived, "below-minimum": &a.PlaysBelowMinimum, "reportable": &a.PlaysReportable,
		"delivered": &a.Delivered, "rejected-by-api": &a.RejectedByAPI, "standby": &a.StandbyAnswered,
		"standby-delivered": &a.StandbyThenDelivered, "pending": &a.Pending, "pending-overdue": &a.PendingOverdue,
		"delivered-twice": &a.DeliveredTwice, "possibly-twice": &a.PossiblyTwice, "below-minimum-delivered": &a.BelowMinimumDelivered,
		"extra-copies": &a.PlaysWithExtraCopies, "parked": &a.Parked,
	}
	for _, p := range x.plays {
		p.lastOutcome, p.lastAnswer = "", ""
		var last int64
		for _, d := range p.deliveries {
			if p.lastOutcome == "" || d.at > last {
				p.lastOutcome, last = d.outcome, d.at
				status, reason := answerOf(d.outcome)
				p.lastAnswer = fmt.Sprintf("%s (HTTP %d", d.outcome, status)
				if reason != "" {
					p.lastAnswer += " " + reason
				}
				if d.message != "" {
					p.lastAnswer += ": " + d.message
				}
				p.lastAnswer += "; attempt 1)"
			}
		}
		for name, cond := range conds {
			if !cond(p) {
				continue
			}
			(*counters[name])++
			row := ListRow{ReportID: p.reportID, EventID: p.eventID, At: time.UnixMilli(int64(p.derivedMS)).UTC(), Detail: p.lastOutcome,
				Delivered: uint64(p.deliveredN), TraceIDs: uniq(p.traces)}
			switch name {
			case "pending", "pending-overdue", "parked":
				row.Detail = p.lastAnswer
			case "rejected-by-api":
				row.Detail = p.message
				byMessage[p.message]++
			case "delivered-twice", "possibly-twice", "delivered":
				row.TraceIDs = uniq(p.deliveredTraces)
			case "extra-copies":
				a.PossibleExtraCopies += uint64(p.copies() - 1)
				row.Detail = strconv.Itoa(p.copies()-1) + ": " + strings.Join(p.copyCauses(), ", ")
				row.TraceIDs = uniq(p.deliveredTraces)
			}
			x.lists[name] = append(x.lists[name], row)
		}
	}
	a.RejectedByAPIByMessage = sortedCounts(byMessage)
	a.DoubtfulPostsByCause = sortedCounts(byCause)

	malformed := map[string]uint64{}
	for _, m := range s.malformed {
		if inWindow(&m.mRec, o) {
			malformed[m.topic]++
			x.lists["malformed"] = append(x.lists["malformed"], ListRow{At: m.ts.UTC(), Kafka: m.key().String()})
		}
	}
	for _, topic := range slices.Sorted(mapKeys(malformed)) {
		a.Malformed = append(a.Malformed, Count{topic, malformed[topic]})
	}
	x.lists["malformed"] = byTimeLoc(x.lists["malformed"])

	s.expectPartners(&x, o)
	s.expectDelay(&x)
	s.expectReplays(&x)
	s.expectHTML(&x)
	return x
}

func (j *mRejection) srcLoc() mLoc {
	if j.src == nil {
		return mLoc{"ingest", -1, -1}
	}
	return j.src.key()
}

func cmpLoc(p, q mLoc) int {
	return cmp.Or(cmp.Compare(p.topic, q.topic), cmp.Compare(p.partition, q.partition), cmp.Compare(p.offset, q.offset))
}

// cmpKafka orders "topic/partition@offset" strings by their parts.
func cmpKafka(p, q string) int { return cmpLoc(parseLoc(p), parseLoc(q)) }

func sortedCounts(m map[string]uint64) []Count {
	out := []Count{}
	for k, n := range m {
		out = append(out, Count{k, n})
	}
	slices.SortFunc(out, func(p, q Count) int { return cmp.Or(cmp.Compare(q.N, p.N), cmp.Compare(p.Key, q.Key)) })
	return out
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}
