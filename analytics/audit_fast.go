package analytics

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The slice query's narrow form (docs/audit.md, "The audit at scale"):
// the per-report columns perReportRows computes, from fewer and cheaper
// aggregate states. On 18.16 the GROUP BY's cost is mostly its aggregate
// functions, one call per row each: perReportRows has eighteen (six
// uniqUpTo states among them), this form six, none of them a String —
//
//   - groupBitOr of a UInt64 per row: the record kinds (deliveryKind), and
//     that the row is a play of the window, below the minimum, recorded
//     before the overdue cutoff, a `delivered` record in doubt, and the
//     partner target of an answer as one bit per target (fastPartnerBit:
//     the snapshot's targets, at most fastMaxPartners);
//   - sum of a UInt64 per row: six counters of fastCountBits bits each
//     (records, delivered, replay delivered, in doubt, replay in doubt,
//     answers): a row adds 1 to those of its kinds;
//   - uniqUpTo(countsUpTo) of the row's location, compared with the rows
//     counted: equal, and at most countsUpTo rows, means no record was
//     read twice (a re-inserted batch), so every counter is a count of
//     distinct records; otherwise the play is not "clean" and its slice
//     is read again by perReportRows with uniqExact (sliceParts);
//   - min of the carried event record time, min of the first delivered
//     answer's time (a sentinel for the other rows: no -If). The first
//     record time of an event recorded twice is not looked up per row (a
//     transform of the event id cost a tenth of the query): the plays it
//     changes are known before (firstRecords.fix), come as rows of their
//     own and their delays are taken in Go; only a slice with more of them
//     than maxLookups folds it in per row (transform);
//   - max of a rejection's message hash (cityHash64, 0 for the other
//     rows): a play rejected with several messages is counted under one of
//     them, as anyIf does in perReportRows.
//
// No String state: an anyIf of a String holds a string value in every
// report's hash cell, and the event id and the rejection message, rare as
// they are, cost a quarter of the slice's query on 18.16 (one slice of the
// 50 M bench ledger: 0.95 s with them, 0.73 s without). The event ids of
// the plays whose event's time is known from nowhere are read before the
// slice from its rows without a time, and the messages' texts after it
// from its rejections (fastSliceCounts).

const (
	fastCountBits   = 10
	fastFirstBit    = 16 // the first partner bit
	fastMaxPartners = 64 - fastFirstBit
	// The row bits beyond deliveryKind's.
	fastPlay           = 1 << 8
	fastBelow          = 1 << 9
	fastDoubtDelivered = 1 << 10
	fastBeforeCutoff   = 1 << 11
	fastUnknownPartner = 1 << 12
	fastPartnerMask    = uint64(1<<64-1) &^ (1<<fastFirstBit - 1)
	fastMaxUInt64      = "toUInt64(18446744073709551615)"
	fastMaxInt64       = "toInt64(9223372036854775807)"
)

// fastCounter is counter i of the sum (0 records, 1 delivered, 2 replay
// delivered, 3 in doubt, 4 replay in doubt, 5 answers) as a column.
func fastCounter(i int) string {
	return fmt.Sprintf("bitAnd(bitShiftRight(counts, %d), %d)", i*fastCountBits, 1<<fastCountBits-1)
}

// fastAdd is the sum's addend of counter i when cond holds.
func fastAdd(i int, cond string) string {
	return fmt.Sprintf("(%s) * %d", cond, uint64(1)<<(i*fastCountBits))
}

// fastPartnerBit is the row bit of partner target j.
func fastPartnerBit(j int) uint64 { return 1 << (fastFirstBit + j) }

// fastEligible tells whether the narrow form can count a slice: the
// partner targets fit its bits, and the events recorded twice are handed
// to it as constants.
func fastEligible(partners []string, x firstRecords) bool {
	return partners != nil && len(partners) <= fastMaxPartners && !x.join
}

// fastSliceRows is one row per play of the window in slice s with
// perReportRows' counts and kinds (not its event id, rejection message and
// partner name), plus before_cutoff (a play row recorded before the
// overdue cutoff), reject_hash, partner_bits (one bit per target) and
// clean (see above), from the narrow states.
func (a *Auditor) fastSliceRows(o AuditOptions, s slice, x firstRecords, partners []string) string {
	rng := s.rng()
	var names, bits strings.Builder
	for j, p := range partners {
		if j > 0 {
			names.WriteByte(',')
			bits.WriteByte(',')
		}
		names.WriteString(quoteSQL(p))
		bits.WriteString("toUInt64(" + strconv.FormatUint(fastPartnerBit(j), 10) + ")")
	}
	partnerBits := fmt.Sprintf("toUInt64(%d)", uint64(fastUnknownPartner))
	if len(partners) > 0 {
		partnerBits = "transform(CAST(partner AS String), [" + names.String() + "], [" + bits.String() + "], " + partnerBits + ")"
	}
	xm := "toUInt64(0)"
	if len(x.ids) > 0 && !x.fixed {
		xm = x.transform("event_id")
	}
	delivered := "outcome = 'delivered' AND replay_id = ''"
	replayDelivered := "outcome = 'delivered' AND replay_id != ''"
	doubt := "doubt_cause != '' AND replay_id = ''"
	replayDoubt := "doubt_cause != '' AND replay_id != ''"
	upTo := strconv.FormatUint(a.limits.countsUpTo(), 10)
	has := func(b int) string { return fmt.Sprintf("toUInt8(bitAnd(kinds, %d) != 0)", b) }
	rows := fastCounter(0) + " + " + fastCounter(5)
	return `(SELECT report_id, ` + has(fastBelow) + ` AS below, ` + has(fastBeforeCutoff) + ` AS before_cutoff,
        if(min(e) = ` + fastMaxUInt64 + `, toUInt64(0), min(e)) AS carried_ms,
        sum(c) AS counts, uniqUpTo(` + upTo + `)(loc) AS distinct_n,
        ` + fastCounter(0) + ` AS records, ` + fastCounter(1) + ` AS delivered_n, ` + fastCounter(2) + ` AS replay_delivered_n,
        ` + fastCounter(3) + ` AS doubt_n, ` + fastCounter(4) + ` AS replay_doubt_n, ` + fastCounter(5) + ` AS answers_n,
        groupBitOr(k) AS kinds,
        ` + has(kindRejected) + ` AS rejected_n, ` + has(kindStandby) + ` AS standby_n, ` + has(kindParked) + ` AS parked_n,
        ` + has(kindReplayed) + ` AS replayed, ` + has(fastDoubtDelivered) + ` AS doubt_delivered,
        if(min(at) = ` + fastMaxInt64 + `, toInt64(0), min(at)) AS delivered_ms,
        max(mh) AS reject_hash,
        bitAnd(kinds, ` + strconv.FormatUint(fastPartnerMask, 10) + `) AS partner_bits,
        if(partner_bits = 0, 0, if(bitAnd(partner_bits, partner_bits - 1) = 0, 1, 2)) AS partners_n,
        toUInt8(` + rows + ` <= ` + upTo + ` AND distinct_n = ` + rows + ` AND bitAnd(kinds, ` + strconv.Itoa(fastUnknownPartner) + `) = 0) AS clean
     FROM (SELECT report_id, toUInt64(` + strconv.Itoa(fastPlay) + ` + below_minimum * ` + strconv.Itoa(fastBelow) + ` + (kafka_time_ms < ` + o.overdueCutoff() + `) * ` + strconv.Itoa(fastBeforeCutoff) + `) AS k,
            toUInt64(1) AS c, ` + reportLoc + ` AS loc, ` + xm + ` AS xm,
            least(if(event_at_ms > 0, toUInt64(event_at_ms), ` + fastMaxUInt64 + `), if(xm > 0, xm, ` + fastMaxUInt64 + `)) AS e,
            ` + fastMaxInt64 + ` AS at, toUInt64(0) AS mh
        FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + rng + `
        UNION ALL SELECT report_id, toUInt64(` + deliveryKind + ` + (in_doubt AND ` + delivered + `) * ` + strconv.Itoa(fastDoubtDelivered) + ` + ` + partnerBits + `),
            toUInt64(` + fastAdd(1, delivered) + ` + ` + fastAdd(2, replayDelivered) + ` + ` + fastAdd(3, doubt) + ` + ` + fastAdd(4, replayDoubt) + ` + ` + fastAdd(5, "1") + `),
            ` + reportLoc + `, toUInt64(0), ` + fastMaxUInt64 + `,
            if(outcome = 'delivered', at_ms, ` + fastMaxInt64 + `),
            if(outcome = 'rejected', cityHash64(message), toUInt64(0))
        FROM ` + a.db + `.deliveries WHERE ` + rng + a.joinFilter(o, s) + asOf(o) + `) AS records
     GROUP BY report_id HAVING bitAnd(kinds, ` + strconv.Itoa(fastPlay) + `) != 0) AS per_report`
}

// sliceParts counts slice s (check: its progress name): by the narrow form
// when partners is not nil, then the plays it left out by perReportRows
// with uniqExact (or, when they are more than it lists, the whole slice);
// else by perReportRows with uniqUpTo, and again with uniqExact when a
// play has more records than uniqUpTo counts.
func (a *Auditor) sliceParts(ctx context.Context, o AuditOptions, s slice, check, sandboxes string, x firstRecords, partners []string) ([]sliceTotals, error) {
	if partners != nil {
		t, err := a.fastSliceCounts(ctx, o, s, check, x, partners)
		switch {
		case err != nil:
			return nil, err
		case t.unclean == 0:
			return []sliceTotals{t}, nil
		case t.unclean <= uint64(len(t.uncleanIDs)):
			u := s
			u.only = "report_id IN (SELECT arrayJoin(" + stringArray(t.uncleanIDs) + "))"
			uctx := withCheck(ctx, o, fmt.Sprintf("%s, exact counts of %d plays", check, t.unclean))
			e, err := a.sliceCounts(uctx, o, u, "uniqExactIf", sandboxes, x)
			return []sliceTotals{t, e}, err
		}
	} else {
		t, err := a.sliceCounts(withCheck(ctx, o, check), o, s, fmt.Sprintf("uniqUpToIf(%d)", a.limits.countsUpTo()), sandboxes, x)
		if err != nil || t.overflow == 0 {
			return []sliceTotals{t}, err
		}
	}
	t, err := a.sliceCounts(withCheck(ctx, o, check+", exact counts"), o, s, "uniqExactIf", sandboxes, x)
	return []sliceTotals{t}, err
}

// The narrow form's figures come as rows of a second GROUP BY (fastClassSQL):
// the per-report rows grouped by the conditions the figures test (a class)
// and by the delay, the partner targets and the rejection message hash, with
// the plays, records, answers, doubtful posts and copies of each group
// summed; fastSliceCounts adds the figures up in Go. On 18.16 the ~35
// countIf and the sumMapIf arrays of one row per slice cost as much as the
// per-report GROUP BY itself (one slice of the 50 M bench ledger on one
// thread: 0.96 CPU-s with them, 0.73 as classes; the per-report GROUP BY
// alone 0.50). A few plays come as rows of their own, with their report
// id (the row kinds below): those the narrow form cannot count, those
// whose event's time is known from nowhere, and those of firstRecords.fix.

// Row kinds of the class query.
const (
	rowCounted   = 0 // counted in its class
	rowUnclean   = 1 // not clean: counted by perReportRows (sliceParts)
	rowUncarried = 2 // delivered, its event's time known from nowhere: looked up
	rowFixed     = 3 // delivered, of firstRecords.fix: its delay from there
)

// fastClassSQL is the class query of slice s; listUncarried: the plays of
// rowUncarried come one row each (else they are counted in their class,
// and their delays joined: sliceUncarriedDelays).
func (a *Auditor) fastClassSQL(o AuditOptions, s slice, x firstRecords, partners []string, listUncarried bool) string {
	del := "(delivered_n > 0 OR replay_delivered_n > 0)"
	fix := "0"
	if x.fixed && len(x.fix) > 0 {
		ids := make([]string, 0, len(x.fix))
		for id := range x.fix {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		fix = "report_id IN (SELECT arrayJoin(" + stringArray(ids) + "))"
	}
	uncarried := "0"
	if listUncarried {
		uncarried = "below = 0 AND " + del + " AND carried_ms = 0"
	}
	kind := fmt.Sprintf("multiIf(clean = 0, %d, %s, %d, below = 0 AND %s AND carried_ms > 0 AND is_fixed = 1, %d, %d)",
		rowUnclean, uncarried, rowUncarried, del, rowFixed, rowCounted)
	keys := []string{"clean", "below", "before_cutoff", "dn", "rdn", "rej", "sb", "pk", "rp", "dd", "pn", "ans", "car", "is_fixed", "pc2", "delay", "partner_bits", "rh", "kind", "rid", "dms"}
	// Limit the rows of plays not clean: past maxLookups the slice is
	// counted again whole (sliceParts), their ids are not needed.
	limitBy := make([]string, 0, len(keys))
	for _, k := range keys {
		if k != "kind" {
			limitBy = append(limitBy, "if(kind = "+strconv.Itoa(rowUnclean)+", "+map[bool]string{true: "''", false: "0"}[k == "rid"]+", "+k+")")
		}
	}
	return `SELECT ` + strings.Join(keys, ", ") + `, n, recs, answers, doubtful, copies FROM (
SELECT clean, below, before_cutoff, toUInt8(least(delivered_n, 2)) AS dn, toUInt8(replay_delivered_n > 0) AS rdn,
    rejected_n AS rej, standby_n AS sb, parked_n AS pk, replayed AS rp, doubt_delivered AS dd, toUInt8(partners_n) AS pn,
    toUInt8(answers_n > 0) AS ans, toUInt8(carried_ms > 0) AS car, toUInt8(` + fix + `) AS is_fixed,
    toUInt8(` + playCopies + ` > 1) AS pc2,
    if(below = 0 AND ` + del + ` AND carried_ms > 0 AND is_fixed = 0, toInt64(delivered_ms) - toInt64(carried_ms), toInt64(0)) AS delay,
    partner_bits, if(rejected_n > 0, reject_hash, toUInt64(0)) AS rh,
    toUInt8(` + kind + `) AS kind, if(kind = 0, '', report_id) AS rid, if(kind = 0, toInt64(0), toInt64(delivered_ms)) AS dms,
    count() AS n, toUInt64(sum(records)) AS recs, toUInt64(sum(answers_n)) AS answers, toUInt64(sum(doubt_n + replay_doubt_n)) AS doubtful,
    toUInt64(sum(` + playCopies + `)) AS copies
FROM ` + a.fastSliceRows(o, s, x, partners) + `
GROUP BY ` + strings.Join(keys, ", ") + `)
LIMIT ` + strconv.Itoa(a.limits.maxLookups()+1) + ` BY kind, ` + strings.Join(limitBy, ", ")
}

// fastSliceCounts reads the figures of slice s by the narrow form: the
// figures of its clean plays, and the report ids of the others
// (t.unclean of them; t.uncleanIDs when at most maxLookups). The
// delivered plays whose event's time is known from nowhere come as
// "delivered_ms event_id" (t.uncarriedPlays: their event ids read first,
// from the slice's rows without a time; when these are more than
// maxLookups the plays are counted in their class and their delays joined
// by auditSliced), the rejected plays' messages get their texts from the
// slice's rejections.
func (a *Auditor) fastSliceCounts(ctx context.Context, o AuditOptions, s slice, check string, x firstRecords, partners []string) (sliceTotals, error) {
	var t sliceTotals
	// The plays with a row without its event's time: a superset of those
	// whose event's time is known from nowhere.
	events := map[string]string{}
	err := a.query(withCheck(ctx, o, check+", plays without their event's time"), `SELECT report_id, any(event_id) FROM `+a.db+`.plays
WHERE `+window(o)+` AND `+s.rng()+` AND event_at_ms = 0 GROUP BY report_id LIMIT `+strconv.Itoa(a.limits.maxLookups()+1),
		func(rows driver.Rows) error {
			var id, ev string
			if err := rows.Scan(&id, &ev); err != nil {
				return err
			}
			events[id] = ev
			return nil
		})
	if err != nil {
		return t, err
	}
	listUncarried := len(events) <= a.limits.maxLookups()
	names := map[uint64]string{}
	for j, p := range partners {
		names[fastPartnerBit(j)] = p
	}
	answers, delivered, messages := map[uint64]uint64{}, map[uint64]uint64{}, map[uint64]uint64{}
	delays := map[int64]uint64{}
	err = a.query(withCheck(ctx, o, check), a.fastClassSQL(o, s, x, partners, listUncarried), func(rows driver.Rows) error {
		var clean, below, beforeCutoff, dn, rdn, rej, sb, pk, rp, dd, pn, ans, car, isFixed, pc2, kind uint8
		var delay, dms int64
		var bits, rh, n, recs, answersN, doubtful, copies uint64
		var rid string
		if err := rows.Scan(&clean, &below, &beforeCutoff, &dn, &rdn, &rej, &sb, &pk, &rp, &dd, &pn, &ans, &car, &isFixed, &pc2,
			&delay, &bits, &rh, &kind, &rid, &dms, &n, &recs, &answersN, &doubtful, &copies); err != nil {
			return err
		}
		if clean == 0 {
			t.unclean += n
			if len(t.uncleanIDs) < a.limits.maxLookups() {
				t.uncleanIDs = append(t.uncleanIDs, rid)
			}
			return nil
		}
		isDel := dn > 0 || rdn == 1
		t.derived += n
		t.records += recs
		t.doubtful += doubtful
		if below == 1 {
			t.below += n
			if isDel {
				t.belowDel += n
			}
		} else {
			t.reportable += n
			if isDel {
				t.delivered += n
			}
			if sb == 1 {
				t.standby += n
				if isDel {
					t.standbyDel += n
				}
			}
			if !isDel && rej == 1 {
				t.rejected += n
				messages[rh] += n
			}
			if !isDel && rej == 0 {
				t.pending += n
				if beforeCutoff == 1 {
					t.overdue += n
				}
				if pk == 1 {
					t.parked += n
				}
			}
			if dn == 1 && dd == 1 {
				t.doubt += n
			}
			if pc2 == 1 {
				t.extraCopies += copies - n
				t.copyPlays += n
			}
			switch {
			case isDel && car == 0:
				t.uncarried += n
				if kind == rowUncarried {
					ev, ok := events[rid]
					if !ok {
						return fmt.Errorf("analytics: audit delay: play %s has no row without its event's time in %s", rid, s)
					}
					t.uncarriedPlays = append(t.uncarriedPlays, strconv.FormatInt(dms, 10)+" "+ev)
				}
			case isDel && kind == rowFixed:
				t.fixedPlays = append(t.fixedPlays, strconv.FormatInt(dms, 10)+" "+rid)
			case isDel:
				delays[delay] += n
			}
		}
		if dn > 1 {
			t.twice += n
		}
		if rp == 1 {
			t.replayed += n
		}
		if pn > 1 {
			t.multiPartner += n
		}
		if ans == 1 {
			answers[bits] += answersN
		}
		if isDel {
			delivered[bits] += n
		}
		if below == 0 && isDel && pn == 1 && IsSandboxTarget(names[bits], o.SandboxTargets) {
			t.sandbox += n
		}
		return nil
	})
	if err != nil {
		return t, err
	}
	if t.uncarried > 0 && !listUncarried {
		t.uncarriedPlays = nil
		t.uncarried = max(t.uncarried, uint64(a.limits.maxLookups())+1) // joined (auditSliced)
	}
	for k, n := range delays {
		t.delayKeys, t.delayCounts = append(t.delayKeys, k), append(t.delayCounts, n)
	}
	for bits, n := range answers {
		if bits == 0 {
			continue
		}
		t.partners, t.partnerHashes = append(t.partners, names[bits]), append(t.partnerHashes, bits)
		t.answerKeys, t.answerCounts = append(t.answerKeys, bits), append(t.answerCounts, n)
	}
	for bits, n := range delivered {
		t.deliveredKeys, t.deliveredCounts = append(t.deliveredKeys, bits), append(t.deliveredCounts, n)
	}
	for h, n := range messages {
		t.messageKeys, t.messageCounts = append(t.messageKeys, h), append(t.messageCounts, n)
	}
	return t, a.rejectMessages(withCheck(ctx, o, check+", messages"), o, s, &t)
}

// rejectMessages gives the narrow form's message hashes of the rejected
// plays (t.messageKeys) their texts, from the slice's rejections.
func (a *Auditor) rejectMessages(ctx context.Context, o AuditOptions, s slice, t *sliceTotals) error {
	if len(t.messageKeys) == 0 {
		return nil
	}
	hashes := make([]string, len(t.messageKeys))
	for i, h := range t.messageKeys {
		hashes[i] = strconv.FormatUint(h, 10)
	}
	err := a.query(ctx, `SELECT cityHash64(message) AS h, any(message) FROM `+a.db+`.deliveries
WHERE `+s.rng()+` AND outcome = 'rejected' AND h IN (`+strings.Join(hashes, ",")+`)`+asOf(o)+`
GROUP BY h`, func(rows driver.Rows) error {
		var h uint64
		var m string
		if err := rows.Scan(&h, &m); err != nil {
			return err
		}
		t.messages, t.messageHashes = append(t.messages, m), append(t.messageHashes, h)
		return nil
	})
	if err != nil {
		return fmt.Errorf("analytics: audit, the messages of the plays rejected by the API: %w", err)
	}
	if len(t.messages) != len(t.messageKeys) {
		return fmt.Errorf("analytics: audit: %d message hashes of rejected plays in %s, %d texts found", len(t.messageKeys), s, len(t.messages))
	}
	return nil
}
