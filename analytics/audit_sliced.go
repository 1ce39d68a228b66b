package analytics

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/schemas"
)

// The audit at scale (docs/audit.md, "The audit at scale"): the figures of
// the window's plays are computed per range of report ids (a slice), each
// range read through the primary index of plays, deliveries and
// report_state (all sorted by report id), so that no query holds more than
// one slice's reports in memory; the slices' figures add up in Go (every
// count is over plays or records, and each play and each of its records
// lies in one slice). The outcomes of a slice come from report_state when
// its backfill is recorded, else from the raw deliveries (the exact path's
// expressions, restricted to the slice): an audit during a backfill reads
// what is built and computes the rest.

// slice is a range of fine slices [lo, hi) read one way.
type slice struct {
	lo, hi int
	state  bool // outcomes from report_state
	// wide: the window holds most of the ledger's plays, so the outcomes
	// joined to its plays are read without the filter on the window's
	// report ids (the join drops the others; an IN set of most report ids
	// costs more than it saves).
	wide bool
}

// joinFilter restricts the outcomes joined to slice s's plays to the
// window's report ids (a leading AND), unless the slice is wide.
func (a *Auditor) joinFilter(o AuditOptions, s slice) string {
	if s.wide {
		return ""
	}
	return " AND report_id IN (" + a.sliceReportIDs(o, s) + ")"
}

// planSlices splits the window's plays into ranges of about
// Limits.SliceReports plays, each wholly backfilled or not.
func (a *Auditor) planSlices(ctx context.Context, o AuditOptions, done [stateSlices]bool) ([]slice, error) {
	var n, total uint64
	if err := a.row(withCheck(ctx, o, "plays in the window"), `SELECT countIf(`+window(o)+`), count() FROM `+a.db+`.plays`, &n, &total); err != nil {
		return nil, err
	}
	wide := 2*n >= total
	if wide {
		n = total // the joined outcomes are the slice's whole ledger
	}
	k := 1
	for k < stateSlices && n/uint64(k) > a.limits.SliceReports {
		k *= 2
	}
	step := stateSlices / k
	var out []slice
	for lo := 0; lo < stateSlices; lo += step {
		s := lo
		for i := lo + 1; i <= lo+step; i++ {
			if i == lo+step || done[i] != done[s] {
				out = append(out, slice{lo: s, hi: i, state: done[s], wide: wide})
				s = i
			}
		}
	}
	return out, nil
}

func (s slice) String() string {
	if s.lo == 0 && s.hi == stateSlices {
		return "all report ids"
	}
	return fmt.Sprintf("report ids %02x–%02x", s.lo, s.hi-1)
}

// slicePlays is one row per play of the window in slice s (perReport's
// per_play, with records: its distinct play records).
func (a *Auditor) slicePlays(o AuditOptions, s slice) string {
	return `SELECT report_id, any(event_id) AS event_id, max(below_minimum) AS below, min(kafka_time_ms) AS derived_ms,
        uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) AS records
     FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + sliceRange(s.lo, s.hi) + ` GROUP BY report_id`
}

// sliceReportIDs are the report ids of the window's plays in slice s.
func (a *Auditor) sliceReportIDs(o AuditOptions, s slice) string {
	return `SELECT report_id FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + sliceRange(s.lo, s.hi)
}

// sliceOutcomes is one row per play of the window in slice s with the
// outcome columns the audit's figures read: from report_state's merged
// states, or from the raw deliveries with perReport's expressions (counts
// only compared with 0 as flags). report_state has no snapshot: a report
// with a Delivery record inserted after the audit's snapshot (o.asOf) is
// read from the raw deliveries up to the snapshot instead, so that every
// figure is of the one ledger state (TestAuditIsOneSnapshot).
func (a *Auditor) sliceOutcomes(o AuditOptions, s slice) string {
	rng := sliceRange(s.lo, s.hi)
	if !s.state {
		return a.rawOutcomes(o, s, "")
	}
	late := `SELECT report_id FROM ` + a.db + `.deliveries WHERE ` + rng + ` AND NOT (1 = 1` + asOf(o) + `)`
	var cols []string
	for _, c := range reportStateColumns {
		cols = append(cols, c.merge+"("+c.name+stateSuffix+") AS "+c.name)
	}
	return `SELECT report_id, ` + strings.Join(cols, ", ") + ` FROM ` + a.db + `.` + TableReportState + `
     WHERE ` + rng + a.joinFilter(o, s) + ` AND report_id NOT IN (` + late + `) GROUP BY report_id
    UNION ALL ` + a.rawOutcomes(o, s, " AND report_id IN ("+late+")")
}

// rawOutcomes is sliceOutcomes from the raw deliveries, with an extra
// condition (a leading AND).
func (a *Auditor) rawOutcomes(o AuditOptions, s slice, and string) string {
	return `SELECT report_id,
        uniqExactIf(` + reportLoc + `, outcome = 'delivered' AND replay_id = '') AS delivered_n,
        uniqExactIf(` + reportLoc + `, outcome = 'delivered' AND replay_id != '') AS replay_delivered_n,
        max(toUInt8(outcome = 'rejected')) AS rejected_n,
        max(toUInt8(outcome = 'standby')) AS standby_n,
        max(toUInt8(outcome = '` + schemas.OutcomeParked + `')) AS parked_n,
        maxIf(in_doubt, outcome = 'delivered' AND replay_id = '') AS doubt_delivered,
        uniqExactIf(` + reportLoc + `, doubt_cause != '' AND replay_id = '') AS doubt_n,
        uniqExactIf(` + reportLoc + `, doubt_cause != '' AND replay_id != '') AS replay_doubt_n,
        minIf(at_ms, outcome = 'delivered') AS delivered_ms,
        max(toUInt8(replay_id != '')) AS replayed,
        anyIf(message, outcome = 'rejected') AS reject_message
     FROM ` + a.db + `.deliveries
     WHERE ` + sliceRange(s.lo, s.hi) + a.joinFilter(o, s) + and + asOf(o) + `
     GROUP BY report_id`
}

// sliceReport is perReport for slice s (its audit columns), with the record
// time of each play's first event (event_ms; has_event = 0 when the
// event is not in the ledger).
func (a *Auditor) sliceReport(o AuditOptions, s slice) string {
	return `(SELECT * FROM (` + a.slicePlays(o, s) + `) AS per_play
    ALL LEFT JOIN (` + a.sliceOutcomes(o, s) + `) AS per_play_outcomes USING report_id) AS per_report
ALL LEFT JOIN
    (SELECT event_id, min(kafka_time_ms) AS event_ms, toUInt8(1) AS has_event FROM ` + a.db + `.events
     WHERE event_id != '' AND event_id IN (SELECT event_id FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + sliceRange(s.lo, s.hi) + `)` + asOf(o) + `
     GROUP BY event_id) AS first_events
USING event_id`
}

// sliceTotals are the figures of one slice that add up.
type sliceTotals struct {
	derived, below, reportable, delivered, rejected, standby, standbyDel uint64
	pending, overdue, twice, belowDel, doubt, parked                     uint64
	extraCopies, copyPlays, records, replayed, doubtful                  uint64
	delayKeys                                                            []int64
	delayCounts                                                          []uint64
	// The messages of the plays rejected by the API, their hashes, and the
	// plays per hash (18.16's sumMap takes numeric keys only).
	messages                   []string
	messageHashes              []uint64
	messageKeys, messageCounts []uint64
}

// auditSliced fills the figures of the window's plays slice by slice:
// PlayRecords, the plays' outcomes, RejectedByAPIByMessage, the copies,
// the partners, the delay and the replays (the exact path: exactPlays).
func (a *Auditor) auditSliced(ctx context.Context, o AuditOptions, r *Audit, plan []slice) error {
	cutoff := o.overdueCutoff()
	delayCond := condDelivered + " AND has_event = 1"
	messages := map[string]uint64{}
	causes := map[string]uint64{}
	partners := map[string]*PartnerCount{}
	replays := map[string]*ReplayCount{}
	delays := map[int64]uint64{}
	sandboxes := a.sandboxList(ctx, o)
	for i, s := range plan {
		name := fmt.Sprintf("plays, slice %d/%d (%s", i+1, len(plan), s)
		if !s.state {
			name += ", from the raw ledger"
		}
		name += ")"
		sctx := withCheck(ctx, o, name)
		var t sliceTotals
		if err := a.row(sctx, `SELECT count(), countIf(below = 1), countIf(`+condReportable+`),
    countIf(`+condDelivered+`), countIf(`+condRejected+`), countIf(`+condStandby+`), countIf(`+condStandbyDel+`),
    countIf(`+condPending+`), countIf(`+condPending+` AND derived_ms < `+cutoff+`), countIf(`+condTwice+`), countIf(`+condBelowDel+`), countIf(`+condDoubt+`),
    countIf(`+condParked+`), toUInt64(sumIf(`+playCopies+` - 1, `+condCopies+`)), countIf(`+condCopies+`), toUInt64(sum(records)),
    countIf(replayed > 0), toUInt64(sum(doubt_n + replay_doubt_n)),
    tupleElement(sumMapIf([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)], `+delayCond+`), 1),
    tupleElement(sumMapIf([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)], `+delayCond+`), 2),
    groupUniqArrayIf(reject_message, `+condRejected+`),
    arrayMap(m -> cityHash64(m), groupUniqArrayIf(reject_message, `+condRejected+`)),
    tupleElement(sumMapIf([cityHash64(reject_message)], [toUInt64(1)], `+condRejected+`), 1),
    tupleElement(sumMapIf([cityHash64(reject_message)], [toUInt64(1)], `+condRejected+`), 2)
FROM `+a.sliceReport(o, s),
			&t.derived, &t.below, &t.reportable, &t.delivered, &t.rejected, &t.standby, &t.standbyDel,
			&t.pending, &t.overdue, &t.twice, &t.belowDel, &t.doubt, &t.parked, &t.extraCopies, &t.copyPlays, &t.records,
			&t.replayed, &t.doubtful, &t.delayKeys, &t.delayCounts,
			&t.messages, &t.messageHashes, &t.messageKeys, &t.messageCounts); err != nil {
			return err
		}
		r.PlaysDerived += t.derived
		r.PlaysBelowMinimum += t.below
		r.PlaysReportable += t.reportable
		r.Delivered += t.delivered
		r.RejectedByAPI += t.rejected
		r.StandbyAnswered += t.standby
		r.StandbyThenDelivered += t.standbyDel
		r.Pending += t.pending
		r.PendingOverdue += t.overdue
		r.DeliveredTwice += t.twice
		r.BelowMinimumDelivered += t.belowDel
		r.PossiblyTwice += t.doubt
		r.Parked += t.parked
		r.PossibleExtraCopies += t.extraCopies
		r.PlaysWithExtraCopies += t.copyPlays
		r.PlayRecords += t.records
		for j, k := range t.delayKeys {
			if j < len(t.delayCounts) {
				delays[k] += t.delayCounts[j]
			}
		}
		byHash := map[uint64]uint64{}
		for j, h := range t.messageKeys {
			if j < len(t.messageCounts) {
				byHash[h] = t.messageCounts[j]
			}
		}
		for j, m := range t.messages {
			if j < len(t.messageHashes) {
				messages[m] += byHash[t.messageHashes[j]]
			}
		}
		if t.doubtful > 0 {
			if err := a.sliceCauses(sctx, o, s, causes); err != nil {
				return err
			}
		}
		if t.derived > 0 {
			if err := a.slicePartners(sctx, o, s, partners, sandboxes, r); err != nil {
				return err
			}
		}
		if t.replayed > 0 {
			if err := a.sliceReplays(sctx, o, s, replays); err != nil {
				return err
			}
		}
	}
	r.RejectedByAPIByMessage = sortCounts(messages)
	r.DoubtfulPostsByCause = sortCounts(causes)
	r.ByPartner = []PartnerCount{}
	for _, p := range partners {
		r.ByPartner = append(r.ByPartner, *p)
	}
	sort.Slice(r.ByPartner, func(i, j int) bool { return r.ByPartner[i].Partner < r.ByPartner[j].Partner })
	r.DeliveredReal = r.Delivered - min(r.Delivered, r.DeliveredToSandbox)
	r.Replays = []ReplayCount{}
	for _, rc := range replays {
		r.Replays = append(r.Replays, *rc)
	}
	sort.Slice(r.Replays, func(i, j int) bool {
		if !r.Replays[i].First.Equal(r.Replays[j].First) {
			return r.Replays[i].First.Before(r.Replays[j].First)
		}
		return r.Replays[i].ID < r.Replays[j].ID
	})
	r.Delay = delayOf(delays)
	return nil
}

// sortCounts is m by count, descending, then key.
func sortCounts(m map[string]uint64) []Count {
	out := []Count{}
	for k, n := range m {
		out = append(out, Count{Key: k, N: n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].N != out[j].N {
			return out[i].N > out[j].N
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// delayOf is the Delay of a multiset of delays (ms → how many plays), with
// ClickHouse's quantilesExact: the value at index ⌊level × n⌋ of the
// sorted values.
func delayOf(m map[int64]uint64) Delay {
	var d Delay
	keys := make([]int64, 0, len(m))
	for k, n := range m {
		if n > 0 {
			keys = append(keys, k)
			d.Plays += n
		}
	}
	if d.Plays == 0 {
		return d
	}
	slices.Sort(keys)
	at := func(level float64) float64 {
		idx := uint64(level * float64(d.Plays))
		var seen uint64
		for _, k := range keys {
			seen += m[k]
			if idx < seen {
				return float64(k)
			}
		}
		return float64(keys[len(keys)-1])
	}
	d.P50MS, d.P90MS, d.P99MS = at(0.5), at(0.9), at(0.99)
	d.MaxMS = float64(keys[len(keys)-1])
	return d
}

// sliceCauses adds the doubtful posts of slice s by cause (copies.go).
func (a *Auditor) sliceCauses(ctx context.Context, o AuditOptions, s slice, causes map[string]uint64) error {
	rng := sliceRange(s.lo, s.hi)
	cs, err := a.counts(ctx, `SELECT doubt_cause, uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset) AS n
FROM `+a.db+`.deliveries
WHERE doubt_cause != '' AND `+rng+` AND report_id IN (`+a.sliceReportIDs(o, s)+`)`+asOf(o)+`
  AND (replay_id = '' OR report_id NOT IN (SELECT report_id FROM `+a.db+`.deliveries WHERE `+rng+` AND outcome = 'delivered' AND replay_id = ''`+asOf(o)+`
      AND report_id IN (SELECT report_id FROM `+a.db+`.deliveries WHERE `+rng+` AND doubt_cause != '' AND replay_id != ''`+asOf(o)+`)))
GROUP BY doubt_cause`)
	for _, c := range cs {
		causes[c.Key] += c.N
	}
	return err
}

// sandboxList is the SQL list of the partner targets of the window's
// deliveries that are sandboxes, "" when none (partners.go).
func (a *Auditor) sandboxList(ctx context.Context, o AuditOptions) string {
	var targets []string
	_ = a.query(withCheck(ctx, o, "partner targets"), `SELECT DISTINCT partner FROM `+a.db+`.deliveries WHERE 1 = 1`+asOf(o), func(rows driver.Rows) error {
		var p string
		if err := rows.Scan(&p); err != nil {
			return err
		}
		if IsSandboxTarget(p, o.SandboxTargets) {
			targets = append(targets, quoteSQL(p))
		}
		return nil
	})
	if len(targets) == 0 {
		return ""
	}
	return "(" + strings.Join(targets, ", ") + ")"
}

// slicePartners adds slice s's deliveries per partner target, and its
// plays delivered only to sandboxes (r.DeliveredToSandbox).
func (a *Auditor) slicePartners(ctx context.Context, o AuditOptions, s slice, partners map[string]*PartnerCount, sandboxes string, r *Audit) error {
	rng := sliceRange(s.lo, s.hi)
	err := a.query(ctx, `SELECT partner, uniqExactIf(report_id, outcome = 'delivered'), uniqExact(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset)
FROM `+a.db+`.deliveries
WHERE `+rng+` AND report_id IN (`+a.sliceReportIDs(o, s)+`)`+asOf(o)+`
GROUP BY partner`, func(rows driver.Rows) error {
		var pc PartnerCount
		if err := rows.Scan(&pc.Partner, &pc.Delivered, &pc.Answers); err != nil {
			return err
		}
		p := partners[pc.Partner]
		if p == nil {
			p = &PartnerCount{Partner: pc.Partner, Sandbox: IsSandboxTarget(pc.Partner, o.SandboxTargets)}
			partners[pc.Partner] = p
		}
		p.Delivered += pc.Delivered
		p.Answers += pc.Answers
		return nil
	})
	if err != nil || sandboxes == "" {
		return err
	}
	var n uint64
	if err := a.row(ctx, `SELECT count() FROM
    (SELECT report_id, max(below_minimum) AS below FROM `+a.db+`.plays WHERE `+window(o)+` AND `+rng+` GROUP BY report_id) AS per_play
ALL INNER JOIN
    (SELECT report_id,
        countIf(outcome = 'delivered' AND partner IN `+sandboxes+`) AS sandbox_n,
        countIf(outcome = 'delivered' AND partner NOT IN `+sandboxes+`) AS real_n
     FROM `+a.db+`.deliveries
     WHERE `+rng+a.joinFilter(o, s)+asOf(o)+`
     GROUP BY report_id) AS per_play_targets
USING report_id
WHERE below = 0 AND sandbox_n > 0 AND real_n = 0`, &n); err != nil {
		return err
	}
	r.DeliveredToSandbox += n
	return nil
}

// sliceReplays adds the replays of slice s's plays (audit.go's replays).
func (a *Auditor) sliceReplays(ctx context.Context, o AuditOptions, s slice, replays map[string]*ReplayCount) error {
	rng := sliceRange(s.lo, s.hi)
	return a.query(ctx, `SELECT replay_id, any(replay_reason), uniqExact(report_id),
    uniqExactIf(report_id, outcome = 'delivered'), uniqExactIf(report_id, outcome = 'rejected'),
    toUInt64(uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, outcome = 'delivered') - uniqExactIf(report_id, outcome = 'delivered')),
    min(at_ms), max(at_ms)
FROM `+a.db+`.deliveries
WHERE replay_id != '' AND `+rng+` AND report_id IN (`+a.sliceReportIDs(o, s)+`)`+asOf(o)+`
GROUP BY replay_id`, func(rows driver.Rows) error {
		var rc ReplayCount
		var first, last int64
		if err := rows.Scan(&rc.ID, &rc.Reason, &rc.Plays, &rc.Delivered, &rc.Rejected, &rc.DeliveredTwice, &first, &last); err != nil {
			return err
		}
		rc.First, rc.Last = time.UnixMilli(first).UTC(), time.UnixMilli(last).UTC()
		p := replays[rc.ID]
		if p == nil {
			replays[rc.ID] = &rc
			return nil
		}
		p.Plays += rc.Plays
		p.Delivered += rc.Delivered
		p.Rejected += rc.Rejected
		p.DeliveredTwice += rc.DeliveredTwice
		if p.Reason == "" {
			p.Reason = rc.Reason
		}
		if rc.First.Before(p.First) {
			p.First = rc.First
		}
		if rc.Last.After(p.Last) {
			p.Last = rc.Last
		}
		return nil
	})
}
