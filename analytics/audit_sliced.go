package analytics

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/schemas"
)

// The audit at scale (docs/audit.md, "The audit at scale"): the figures of
// the window's plays are computed per range of report ids (a slice), each
// range read through the primary index of plays and deliveries (both
// sorted by report id), so that no query holds more than one slice's
// reports in memory; the slices' figures add up in Go (every count is over
// plays or records, and each play and each of its records lies in one
// slice). A slice is one GROUP BY report id over its plays and Delivery
// records read as one stream (sliceReport): no join of plays with
// outcomes, no per-report hash set.

// slice is a range of fine slices [lo, hi).
type slice struct {
	lo, hi int
	// wide: the window holds most of the ledger's plays, so the outcomes
	// grouped with its plays are read without the filter on the window's
	// report ids (the HAVING drops the others; an IN set of most report
	// ids costs more than it saves).
	wide bool
	// only, when set, narrows the slice's reports further (a condition on
	// report_id: the plays the narrow form left out, audit_fast.go).
	only string
}

// rng is the condition on report_id of slice s.
func (s slice) rng() string {
	if s.only == "" {
		return sliceRange(s.lo, s.hi)
	}
	return sliceRange(s.lo, s.hi) + " AND " + s.only
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
// Limits.SliceReports plays.
func (a *Auditor) planSlices(ctx context.Context, o AuditOptions) ([]slice, error) {
	var n, total uint64
	if err := a.row(withCheck(ctx, o, "plays in the window"), `SELECT countIf(`+window(o)+`), count() FROM `+a.db+`.plays`, &n, &total); err != nil {
		return nil, err
	}
	wide := 2*n >= total
	if wide {
		n = total // the grouped outcomes are the slice's whole ledger
	}
	k := 1
	for k < stateSlices && n/uint64(k) > a.limits.SliceReports {
		k *= 2
	}
	step := stateSlices / k
	var out []slice
	for lo := 0; lo < stateSlices; lo += step {
		out = append(out, slice{lo: lo, hi: lo + step, wide: wide})
	}
	return out, nil
}

func (s slice) String() string {
	if s.lo == 0 && s.hi == stateSlices {
		return "all report ids"
	}
	return fmt.Sprintf("report ids %02x–%02x", s.lo, s.hi-1)
}

// sliceReportIDs are the report ids of the window's plays in slice s.
func (a *Auditor) sliceReportIDs(o AuditOptions, s slice) string {
	return `SELECT report_id FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + sliceRange(s.lo, s.hi)
}

// sliceFewReportIDs are the report ids of the window's plays in slice s
// that have a Delivery record matching cond (a rare kind: a doubt, a
// replay): the set of the slice's few such reports is built first, and the
// window's plays only looked up in it, instead of a set of every play of
// the slice.
func (a *Auditor) sliceFewReportIDs(o AuditOptions, s slice, cond string) string {
	rng := sliceRange(s.lo, s.hi)
	return `SELECT report_id FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + rng + ` AND report_id IN (SELECT report_id FROM ` +
		a.db + `.deliveries WHERE ` + cond + ` AND ` + rng + asOf(o) + `)`
}

// Delivery record kinds, the bits of deliveryKind: a report's kinds are
// the bitwise OR of its records' (groupBitOr).
const (
	kindDelivered       = 1   // outcome delivered, by the reporter
	kindReplayDelivered = 2   // outcome delivered, by a replay
	kindRejected        = 4   // outcome rejected (400)
	kindStandby         = 8   // outcome standby
	kindParked          = 16  // outcome parked
	kindDoubt           = 32  // a post in doubt (doubt_cause), by the reporter
	kindReplayDoubt     = 64  // a post in doubt, by a replay
	kindReplayed        = 128 // a replay's record
)

// deliveryKind is a deliveries row's kind bits.
var deliveryKind = fmt.Sprintf("toUInt8((outcome = 'delivered' AND replay_id = '') * %d + (outcome = 'delivered' AND replay_id != '') * %d"+
	" + (outcome = 'rejected') * %d + (outcome = 'standby') * %d + (outcome = '%s') * %d"+
	" + (doubt_cause != '' AND replay_id = '') * %d + (doubt_cause != '' AND replay_id != '') * %d + (replay_id != '') * %d)",
	kindDelivered, kindReplayDelivered, kindRejected, kindStandby, schemas.OutcomeParked, kindParked, kindDoubt, kindReplayDoubt, kindReplayed)

// countsUpTo is the number of distinct records per play and kind the
// slice query counts exactly with uniqUpTo's small fixed state (a play
// has one or two of each); a slice with a play of more is read again with
// uniqExact (sliceCounts).
const countsUpTo = 8

// slicePerReport is one row per play of the window in slice s
// (perReportRows): the window's plays of the slice and the slice's
// Delivery records (up to the snapshot) read as one stream and grouped by
// report id once — no join of plays with outcomes — with cheap idempotent
// states: the bitwise OR of the records' kinds, the distinct record
// locations counted by uniq (uniqUpTo(countsUpTo), or uniqExact), min,
// max, any. A report without a play in the window is dropped by the
// HAVING.
func (a *Auditor) slicePerReport(o AuditOptions, s slice, uniq string) string {
	return a.perReportRows(o, s.rng(), a.joinFilter(o, s), uniq)
}

// perReportRows is one row per play of the window whose report id meets
// rng, its Delivery records those meeting rng and filter (a leading AND).
// carried_ms is the earliest event record time its window plays carry
// (plays.event_at_ms; 0 when none carries one: rows written before the
// column existed).
func (a *Auditor) perReportRows(o AuditOptions, rng, filter, uniq string) string {
	bit := func(b int) string { return fmt.Sprintf("bitAnd(k, %d) != 0", b) }
	has := func(b int) string { return fmt.Sprintf("toUInt8(bitAnd(kinds, %d) != 0)", b) }
	return `SELECT report_id, anyIf(ev, p = 1) AS event_id, max(bm) AS below, minIf(t, p = 1) AS derived_ms,
        minIf(e, p = 1 AND e > 0) AS carried_ms,
        ` + uniq + `(loc, p = 1) AS records,
        ` + uniq + `(loc, ` + bit(kindDelivered) + `) AS delivered_n,
        ` + uniq + `(loc, ` + bit(kindReplayDelivered) + `) AS replay_delivered_n,
        ` + uniq + `(loc, ` + bit(kindDoubt) + `) AS doubt_n,
        ` + uniq + `(loc, ` + bit(kindReplayDoubt) + `) AS replay_doubt_n,
        groupBitOr(k) AS kinds,
        ` + has(kindRejected) + ` AS rejected_n, ` + has(kindStandby) + ` AS standby_n, ` + has(kindParked) + ` AS parked_n,
        ` + has(kindReplayed) + ` AS replayed,
        maxIf(doubt, ` + bit(kindDelivered) + `) AS doubt_delivered,
        minIf(at, ` + bit(kindDelivered|kindReplayDelivered) + `) AS delivered_ms,
        anyIf(msg, ` + bit(kindRejected) + `) AS reject_message,
        ` + uniq + `(loc, p = 0) AS answers_n,
        ` + uniq + `(cityHash64(pt), p = 0) AS partners_n,
        anyIf(pt, p = 0) AS partner
     FROM (SELECT report_id, toUInt8(1) AS p, event_id AS ev, toUInt8(below_minimum) AS bm, toUInt64(kafka_time_ms) AS t, toUInt64(event_at_ms) AS e, ` + reportLoc + ` AS loc,
            toUInt8(0) AS k, toUInt8(0) AS doubt, toInt64(0) AS at, '' AS msg, '' AS pt
        FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + rng + `
        UNION ALL SELECT report_id, toUInt8(0), '', toUInt8(0), toUInt64(0), toUInt64(0), ` + reportLoc + `,
            ` + deliveryKind + `, toUInt8(in_doubt), toInt64(at_ms), if(outcome = 'rejected', CAST(message AS String), ''), CAST(partner AS String)
        FROM ` + a.db + `.deliveries WHERE ` + rng + filter + asOf(o) + `) AS records
     GROUP BY report_id HAVING max(p) = 1`
}

// sliceTotals are the figures of one slice that add up.
type sliceTotals struct {
	derived, below, reportable, delivered, rejected, standby, standbyDel uint64
	pending, overdue, twice, belowDel, doubt, parked                     uint64
	extraCopies, copyPlays, records, replayed, doubtful                  uint64
	// The delays of the delivered plays (ms → plays) whose event's first
	// record the slice query knows, and how many it does not know
	// (uncarriedCond): "delivered_ms event_id" of each, when at most
	// maxLookups.
	delayKeys      []int64
	delayCounts    []uint64
	uncarried      uint64
	uncarriedPlays []string
	// The messages of the plays rejected by the API, their hashes, and the
	// plays per hash (18.16's sumMap takes numeric keys only).
	messages                   []string
	messageHashes              []uint64
	messageKeys, messageCounts []uint64
	overflow                   uint64
	// The partners: plays with records from more than one partner target
	// (their slice is counted by slicePartners), the partner of each other
	// play with records, their hashes, per hash the distinct records and
	// the delivered plays, and the plays delivered only to a sandbox.
	multiPartner                   uint64
	partners                       []string
	partnerHashes                  []uint64
	answerKeys, answerCounts       []uint64
	deliveredKeys, deliveredCounts []uint64
	sandbox                        uint64
	// The plays the narrow form leaves out (sliceCounts).
	unclean    uint64
	uncleanIDs []string
	// The delivered plays of firstRecords.fix, "delivered_ms report_id":
	// not in delayKeys.
	fixedPlays []string
}

// auditSliced fills the figures of the window's plays slice by slice:
// PlayRecords, the plays' outcomes, RejectedByAPIByMessage, the copies,
// the partners, the delay and the replays (the exact path: exactPlays).
func (a *Auditor) auditSliced(ctx context.Context, o AuditOptions, r *Audit, plan []slice) error {
	messages := map[string]uint64{}
	causes := map[string]uint64{}
	partners := map[string]*PartnerCount{}
	replays := map[string]*ReplayCount{}
	delays := map[int64]uint64{}
	targets, sandboxes := a.partnerTargets(ctx, o)
	x, err := a.eventsRecordedTwice(ctx, o)
	if err != nil {
		return err
	}
	if !fastEligible(targets, x) || a.limits.noNarrow {
		targets = nil
	}
	xs, err := a.splitRecordedTwice(ctx, o, x, plan)
	if err != nil {
		return err
	}
	threads := a.serverThreads(ctx, o)
	var lookup lookups
	err = a.eachSlice(ctx, len(plan), func(ctx context.Context, i int) (sliceOut, error) {
		return a.readSlice(withShare(ctx, share{n: sliceWorkers, threads: threads}), o, plan, i, xs[i], sandboxes, targets)
	}, func(ctx context.Context, i int, out sliceOut, slots chan struct{}) error {
		x := xs[i]
		for _, t := range out.ts {
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
			addDelays(delays, t.delayKeys, t.delayCounts)
			if err := addFixedDelays(delays, t.fixedPlays, x.fix); err != nil {
				return err
			}
			t.addMessages(messages)
		}
		if out.joined != nil {
			for k, n := range out.joined {
				delays[k] += n
			}
		} else {
			for _, t := range out.ts {
				if err := lookup.add(t.uncarriedPlays); err != nil {
					return err
				}
			}
			if len(lookup.delivered) >= a.limits.maxLookups() {
				// A query beside the slices' takes one of their places.
				slots <- struct{}{}
				err := a.flush(withShare(ctx, share{n: sliceWorkers, threads: threads}), o, &lookup, false, delays)
				<-slots
				if err != nil {
					return err
				}
			}
		}
		for k, n := range out.causes {
			causes[k] += n
		}
		if out.partners != nil {
			for _, p := range out.partners {
				addPartner(partners, *p)
			}
			r.DeliveredToSandbox += out.sandbox
		} else {
			for _, t := range out.ts {
				t.addPartners(partners, o.SandboxTargets)
				r.DeliveredToSandbox += t.sandbox
			}
		}
		for _, rc := range out.replays {
			addReplay(replays, *rc)
		}
		return nil
	})
	if err != nil {
		return err
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
	if err := a.flush(ctx, o, &lookup, true, delays); err != nil {
		return err
	}
	r.Delay = delayOf(delays)
	return nil
}

// sliceCounts reads the figures of slice s that add up, the distinct
// records counted by uniq (an -If aggregate of a location and a condition);
// t.overflow says how many plays have more records of one kind than
// uniqUpTo counted. (The narrow form is fastSliceCounts.)
func (a *Auditor) sliceCounts(ctx context.Context, o AuditOptions, s slice, uniq, sandboxes string, x firstRecords) (sliceTotals, error) {
	var t sliceTotals
	err := a.row(ctx, a.sliceCountsSQL(o, s, uniq, sandboxes, x),
		&t.derived, &t.below, &t.reportable, &t.delivered, &t.rejected, &t.standby, &t.standbyDel,
		&t.pending, &t.overdue, &t.twice, &t.belowDel, &t.doubt, &t.parked, &t.extraCopies, &t.copyPlays, &t.records,
		&t.replayed, &t.doubtful, &t.delayKeys, &t.delayCounts, &t.uncarried, &t.uncarriedPlays,
		&t.messages, &t.messageHashes, &t.messageKeys, &t.messageCounts, &t.overflow,
		&t.multiPartner, &t.partners, &t.partnerHashes, &t.answerKeys, &t.answerCounts, &t.deliveredKeys, &t.deliveredCounts, &t.sandbox,
		&t.unclean, &t.uncleanIDs)
	return t, err
}

// sliceCountsSQL is sliceCounts' query.
func (a *Auditor) sliceCountsSQL(o AuditOptions, s slice, uniq, sandboxes string, x firstRecords) string {
	overdue := "derived_ms < " + o.overdueCutoff()
	over := strconv.FormatUint(a.limits.countsUpTo(), 10)
	overflow := "records > " + over + " OR delivered_n > " + over + " OR replay_delivered_n > " + over + " OR doubt_n > " + over + " OR replay_doubt_n > " + over + " OR answers_n > " + over
	from, keep, unclean := a.sliceEvents(o, s, uniq, x), "1", "toUInt64(0), emptyArrayString()"
	delayCond := condDelivered + " AND (carried_ms > 0 OR has_event = 1)"
	uncarried := uncarriedCond(x)
	lookups := strconv.Itoa(a.limits.maxLookups())
	f := func(c string) string { return "(" + c + ") AND " + keep }
	sandboxCond := "0"
	if sandboxes != "" {
		sandboxCond = condDelivered + " AND partner IN " + sandboxes
	}
	return `SELECT countIf(` + keep + `), countIf(` + f("below = 1") + `), countIf(` + f(condReportable) + `),
    countIf(` + f(condDelivered) + `), countIf(` + f(condRejected) + `), countIf(` + f(condStandby) + `), countIf(` + f(condStandbyDel) + `),
    countIf(` + f(condPending) + `), countIf(` + f(condPending+" AND "+overdue) + `), countIf(` + f(condTwice) + `), countIf(` + f(condBelowDel) + `), countIf(` + f(condDoubt) + `),
    countIf(` + f(condParked) + `), toUInt64(sumIf(` + playCopies + ` - 1, ` + f(condCopies) + `)), countIf(` + f(condCopies) + `), toUInt64(sumIf(records, ` + keep + `)),
    countIf(` + f("replayed > 0") + `), toUInt64(sumIf(doubt_n + replay_doubt_n, ` + keep + `)),
    tupleElement(sumMapIf([toInt64(delivered_ms) - toInt64(` + firstRecord + `)], [toUInt64(1)], ` + f(delayCond) + `), 1),
    tupleElement(sumMapIf([toInt64(delivered_ms) - toInt64(` + firstRecord + `)], [toUInt64(1)], ` + f(delayCond) + `), 2),
    countIf(` + f(uncarried) + `), groupArrayIf(` + lookups + `)(concat(toString(delivered_ms), ' ', event_id), ` + f(uncarried) + `),
    groupUniqArrayIf(reject_message, ` + f(condRejected) + `),
    arrayMap(m -> cityHash64(m), groupUniqArrayIf(reject_message, ` + f(condRejected) + `)),
    tupleElement(sumMapIf([cityHash64(reject_message)], [toUInt64(1)], ` + f(condRejected) + `), 1),
    tupleElement(sumMapIf([cityHash64(reject_message)], [toUInt64(1)], ` + f(condRejected) + `), 2),
    countIf(` + overflow + `),
    countIf(` + f("partners_n > 1") + `),
    groupUniqArrayIf(partner, ` + f("answers_n > 0") + `),
    arrayMap(m -> cityHash64(m), groupUniqArrayIf(partner, ` + f("answers_n > 0") + `)),
    tupleElement(sumMapIf([cityHash64(partner)], [toUInt64(answers_n)], ` + f("answers_n > 0") + `), 1),
    tupleElement(sumMapIf([cityHash64(partner)], [toUInt64(answers_n)], ` + f("answers_n > 0") + `), 2),
    tupleElement(sumMapIf([cityHash64(partner)], [toUInt64(1)], ` + f("delivered_n > 0 OR replay_delivered_n > 0") + `), 1),
    tupleElement(sumMapIf([cityHash64(partner)], [toUInt64(1)], ` + f("delivered_n > 0 OR replay_delivered_n > 0") + `), 2),
    countIf(` + f(sandboxCond) + `), ` + unclean + `
FROM ` + from
}

// addMessages adds the slice's rejected plays by message.
func (t sliceTotals) addMessages(messages map[string]uint64) {
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
}

// addPartners adds the slice's plays of one partner target each (t.multiPartner = 0).
func (t sliceTotals) addPartners(partners map[string]*PartnerCount, sandboxTargets []string) {
	answers, delivered := map[uint64]uint64{}, map[uint64]uint64{}
	for j, h := range t.answerKeys {
		if j < len(t.answerCounts) {
			answers[h] = t.answerCounts[j]
		}
	}
	for j, h := range t.deliveredKeys {
		if j < len(t.deliveredCounts) {
			delivered[h] = t.deliveredCounts[j]
		}
	}
	for j, name := range t.partners {
		if j >= len(t.partnerHashes) {
			break
		}
		p := partners[name]
		if p == nil {
			p = &PartnerCount{Partner: name, Sandbox: IsSandboxTarget(name, sandboxTargets)}
			partners[name] = p
		}
		p.Answers += answers[t.partnerHashes[j]]
		p.Delivered += delivered[t.partnerHashes[j]]
	}
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
WHERE doubt_cause != '' AND `+rng+` AND report_id IN (`+a.sliceFewReportIDs(o, s, "doubt_cause != ''")+`)`+asOf(o)+`
  AND (replay_id = '' OR report_id NOT IN (SELECT report_id FROM `+a.db+`.deliveries WHERE `+rng+` AND outcome = 'delivered' AND replay_id = ''`+asOf(o)+`
      AND report_id IN (SELECT report_id FROM `+a.db+`.deliveries WHERE `+rng+` AND doubt_cause != '' AND replay_id != ''`+asOf(o)+`)))
GROUP BY doubt_cause`)
	for _, c := range cs {
		causes[c.Key] += c.N
	}
	return err
}

// partnerTargets are the partner targets of the ledger's deliveries (as
// of the snapshot; nil when they cannot be read), and the SQL list of
// those that are sandboxes, "" when none (partners.go).
func (a *Auditor) partnerTargets(ctx context.Context, o AuditOptions) ([]string, string) {
	all := []string{}
	var sandboxes []string
	err := a.query(withCheck(ctx, o, "partner targets"), `SELECT DISTINCT CAST(partner AS String) FROM `+a.db+`.deliveries WHERE 1 = 1`+asOf(o), func(rows driver.Rows) error {
		var p string
		if err := rows.Scan(&p); err != nil {
			return err
		}
		all = append(all, p)
		if IsSandboxTarget(p, o.SandboxTargets) {
			sandboxes = append(sandboxes, quoteSQL(p))
		}
		return nil
	})
	if err != nil {
		all = nil
	}
	if len(sandboxes) == 0 {
		return all, ""
	}
	return all, "(" + strings.Join(sandboxes, ", ") + ")"
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
		pc.Sandbox = IsSandboxTarget(pc.Partner, o.SandboxTargets)
		addPartner(partners, pc)
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

// addPartner adds one slice's counts of a partner target to partners.
func addPartner(partners map[string]*PartnerCount, pc PartnerCount) {
	p := partners[pc.Partner]
	if p == nil {
		p = &PartnerCount{Partner: pc.Partner, Sandbox: pc.Sandbox}
		partners[pc.Partner] = p
	}
	p.Delivered += pc.Delivered
	p.Answers += pc.Answers
}

// sliceReplays adds the replays of slice s's plays (audit.go's replays).
func (a *Auditor) sliceReplays(ctx context.Context, o AuditOptions, s slice, replays map[string]*ReplayCount) error {
	rng := sliceRange(s.lo, s.hi)
	return a.query(ctx, `SELECT replay_id, any(replay_reason), uniqExact(report_id),
    uniqExactIf(report_id, outcome = 'delivered'), uniqExactIf(report_id, outcome = 'rejected'),
    toUInt64(uniqExactIf(kafka_topic_id, kafka_topic, kafka_partition, kafka_offset, outcome = 'delivered') - uniqExactIf(report_id, outcome = 'delivered')),
    min(at_ms), max(at_ms)
FROM `+a.db+`.deliveries
WHERE replay_id != '' AND `+rng+` AND report_id IN (`+a.sliceFewReportIDs(o, s, "replay_id != ''")+`)`+asOf(o)+`
GROUP BY replay_id`, func(rows driver.Rows) error {
		var rc ReplayCount
		var first, last int64
		if err := rows.Scan(&rc.ID, &rc.Reason, &rc.Plays, &rc.Delivered, &rc.Rejected, &rc.DeliveredTwice, &first, &last); err != nil {
			return err
		}
		rc.First, rc.Last = time.UnixMilli(first).UTC(), time.UnixMilli(last).UTC()
		addReplay(replays, rc)
		return nil
	})
}

// addReplay adds one slice's counts of a replay to replays.
func addReplay(replays map[string]*ReplayCount, rc ReplayCount) {
	p := replays[rc.ID]
	if p == nil {
		replays[rc.ID] = &rc
		return
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
}
