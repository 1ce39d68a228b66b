package analytics

import (
	"context"
	"fmt"
	"strconv"
	"strings"
)

// The slice query's narrow form (docs/audit.md, "The audit at scale"):
// the same per-report columns as perReportRows, from fewer and cheaper
// aggregate states. On 18.16 the GROUP BY's cost is mostly its aggregate
// functions, one call per row each: perReportRows has eighteen (six
// uniqUpTo states among them), this form six —
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
//     is read again by perReportRows with uniqExact (sliceCounts'
//     fallback);
//   - min of the carried event record time (and, for the events recorded
//     twice, their first record time: transform), min of the first
//     delivered answer's time (a sentinel for the other rows: no -If);
//   - anyIf of the event id of a play whose event's time is known from
//     nowhere (looked up afterwards), and of a rejection's message.

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

// fastSliceRows is perReportRows' columns (and sliceEvents': event_ms and
// has_event, both 0: the first record time of an event recorded twice is
// folded into carried_ms) for slice s, plus before_cutoff (a play row
// recorded before the overdue cutoff) and clean (see above), from the
// narrow states.
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
	partnerName := "''"
	if len(partners) > 0 {
		partnerBits = "transform(CAST(partner AS String), [" + names.String() + "], [" + bits.String() + "], " + partnerBits + ")"
		partnerName = "transform(bitAnd(kinds, " + strconv.FormatUint(fastPartnerMask, 10) + "), [" + bits.String() + "], [" + names.String() + "], '')"
	}
	xm := "toUInt64(0)"
	if len(x.ids) > 0 {
		xm = x.transform("event_id")
	}
	delivered := "outcome = 'delivered' AND replay_id = ''"
	replayDelivered := "outcome = 'delivered' AND replay_id != ''"
	doubt := "doubt_cause != '' AND replay_id = ''"
	replayDoubt := "doubt_cause != '' AND replay_id != ''"
	upTo := strconv.FormatUint(a.limits.countsUpTo(), 10)
	has := func(b int) string { return fmt.Sprintf("toUInt8(bitAnd(kinds, %d) != 0)", b) }
	rows := fastCounter(0) + " + " + fastCounter(5)
	return `(SELECT report_id, anyIf(ev, ev != '') AS event_id, ` + has(fastBelow) + ` AS below, ` + has(fastBeforeCutoff) + ` AS before_cutoff,
        if(min(e) = ` + fastMaxUInt64 + `, toUInt64(0), min(e)) AS carried_ms,
        sum(c) AS counts, uniqUpTo(` + upTo + `)(loc) AS distinct_n,
        ` + fastCounter(0) + ` AS records, ` + fastCounter(1) + ` AS delivered_n, ` + fastCounter(2) + ` AS replay_delivered_n,
        ` + fastCounter(3) + ` AS doubt_n, ` + fastCounter(4) + ` AS replay_doubt_n, ` + fastCounter(5) + ` AS answers_n,
        groupBitOr(k) AS kinds,
        ` + has(kindRejected) + ` AS rejected_n, ` + has(kindStandby) + ` AS standby_n, ` + has(kindParked) + ` AS parked_n,
        ` + has(kindReplayed) + ` AS replayed, ` + has(fastDoubtDelivered) + ` AS doubt_delivered,
        if(min(at) = ` + fastMaxInt64 + `, toInt64(0), min(at)) AS delivered_ms,
        anyIf(msg, bitAnd(k, ` + strconv.Itoa(kindRejected) + `) != 0) AS reject_message,
        bitAnd(kinds, ` + strconv.FormatUint(fastPartnerMask, 10) + `) AS partner_bits,
        if(partner_bits = 0, 0, if(bitAnd(partner_bits, partner_bits - 1) = 0, 1, 2)) AS partners_n,
        ` + partnerName + ` AS partner,
        toUInt8(` + rows + ` <= ` + upTo + ` AND distinct_n = ` + rows + ` AND bitAnd(kinds, ` + strconv.Itoa(fastUnknownPartner) + `) = 0) AS clean,
        toUInt64(0) AS event_ms, toUInt8(0) AS has_event
     FROM (SELECT report_id, toUInt64(` + strconv.Itoa(fastPlay) + ` + below_minimum * ` + strconv.Itoa(fastBelow) + ` + (kafka_time_ms < ` + o.overdueCutoff() + `) * ` + strconv.Itoa(fastBeforeCutoff) + `) AS k,
            toUInt64(1) AS c, ` + reportLoc + ` AS loc, ` + xm + ` AS xm,
            least(if(event_at_ms > 0, toUInt64(event_at_ms), ` + fastMaxUInt64 + `), if(xm > 0, xm, ` + fastMaxUInt64 + `)) AS e,
            ` + fastMaxInt64 + ` AS at, if(event_at_ms = 0 AND xm = 0, event_id, '') AS ev, '' AS msg
        FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + rng + `
        UNION ALL SELECT report_id, toUInt64(` + deliveryKind + ` + (in_doubt AND ` + delivered + `) * ` + strconv.Itoa(fastDoubtDelivered) + ` + ` + partnerBits + `),
            toUInt64(` + fastAdd(1, delivered) + ` + ` + fastAdd(2, replayDelivered) + ` + ` + fastAdd(3, doubt) + ` + ` + fastAdd(4, replayDoubt) + ` + ` + fastAdd(5, "1") + `),
            ` + reportLoc + `, toUInt64(0), ` + fastMaxUInt64 + `,
            if(outcome = 'delivered', at_ms, ` + fastMaxInt64 + `), '', if(outcome = 'rejected', CAST(message AS String), '')
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
		t, err := a.sliceCounts(withCheck(ctx, o, check), o, s, "", sandboxes, x, partners)
		switch {
		case err != nil:
			return nil, err
		case t.unclean == 0:
			return []sliceTotals{t}, nil
		case t.unclean <= uint64(len(t.uncleanIDs)):
			u := s
			u.only = "report_id IN (SELECT arrayJoin(" + stringArray(t.uncleanIDs) + "))"
			uctx := withCheck(ctx, o, fmt.Sprintf("%s, exact counts of %d plays", check, t.unclean))
			e, err := a.sliceCounts(uctx, o, u, "uniqExactIf", sandboxes, x, nil)
			return []sliceTotals{t, e}, err
		}
	} else {
		t, err := a.sliceCounts(withCheck(ctx, o, check), o, s, fmt.Sprintf("uniqUpToIf(%d)", a.limits.countsUpTo()), sandboxes, x, nil)
		if err != nil || t.overflow == 0 {
			return []sliceTotals{t}, err
		}
	}
	t, err := a.sliceCounts(withCheck(ctx, o, check+", exact counts"), o, s, "uniqExactIf", sandboxes, x, nil)
	return []sliceTotals{t}, err
}
