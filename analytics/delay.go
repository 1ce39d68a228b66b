package analytics

import (
	"context"
	"fmt"
)

// The delay (docs/audit.md, "The delay"): from the first record of a
// delivered play's event to the play's first `delivered` answer. The first
// record is the earliest of the event's records in the events table (as
// of the snapshot) and of the event record times the play's window rows
// carry (plays.event_at_ms, the Kafka timestamp of the event record the
// consumer derived the play from; 0 in rows written before the column
// existed). A play whose event is in neither has no delay.
//
// The slices read the carried time with the play (no lookup of the events
// table, which is sorted by record time, not by anything a slice of report
// ids selects). It is the event's first record unless the event has an
// earlier record than the ones the play's rows carry: then the event was
// recorded at least twice at different times (or its carried record is
// missing from the events table: below). Those events are found once per
// audit (earlierEventRecords) and their plays' delays corrected; the plays
// that carry no time at all (old rows) look their events up per slice, as
// before (uncarriedDelays): in one query when they are few, else per slice
// that has such a play.
//
// The one case the correction cannot see: a play that carries the time of
// an event record missing from the events table (a sink that never copied
// it) while the table holds another record of the same event, at another
// time, and no record at that time. The slices then take the carried time,
// the exact path the earlier of the two.

// firstRecord is the SQL of a play's first event record time: the events'
// earliest (event_ms, when has_event = 1) or the carried one (carried_ms,
// when > 0), whichever is earlier.
const firstRecord = "if(has_event = 1 AND (carried_ms = 0 OR event_ms < carried_ms), event_ms, carried_ms)"

// delay is one delay per delivered play of the window (the exact path):
// several plays of an event share its one row of event_ms, so the join is
// ALL (ANY INNER would keep one play per event on current releases, and
// every play on 18.16).
func (a *Auditor) delay(ctx context.Context, o AuditOptions) (Delay, error) {
	w := window(o)
	q := `SELECT count(), quantilesExact(0.5, 0.9, 0.99)(delay), max(delay) FROM (
    SELECT toFloat64(toInt64(delivered_ms) - toInt64(` + firstRecord + `)) AS delay FROM (
        SELECT event_id, delivered_ms, carried_ms FROM ` + a.perReport(o) + ` WHERE ` + condDelivered + `
    ) AS delivered_plays ALL LEFT JOIN (
        SELECT event_id, min(kafka_time_ms) AS event_ms, toUInt8(1) AS has_event FROM ` + a.db + `.events
        WHERE event_id != '' AND event_id IN (SELECT event_id FROM ` + a.db + `.plays WHERE ` + w + `)` + asOf(o) + `
        GROUP BY event_id
    ) AS first_events USING event_id
    WHERE has_event = 1 OR carried_ms > 0
)`
	var d Delay
	var qs []float64
	if err := a.row(ctx, q, &d.Plays, &qs, &d.MaxMS); err != nil {
		return d, fmt.Errorf("analytics: audit delay: %w", err)
	}
	if d.Plays > 0 && len(qs) == 3 {
		d.P50MS, d.P90MS, d.P99MS = qs[0], qs[1], qs[2]
	} else {
		d.MaxMS = 0
	}
	return d, nil
}

// addDelays adds counts[j] plays of delay keys[j] to m.
func addDelays(m map[int64]uint64, keys []int64, counts []uint64) {
	for j, k := range keys {
		if j < len(counts) {
			m[k] += counts[j]
		}
	}
}

// uncarriedDelays adds the delays of the delivered plays whose window rows
// carry no event record time (rows written before plays.event_at_ms
// existed): their events looked up in the events table. The slices with
// such plays are given (with their number of such plays); when they hold
// no more than Limits.SliceReports of them (a ledger that began before the
// column), all are read in one query, one pass over the events table;
// else slice by slice, as the slices' own size bounds the memory (an old
// ledger: a pass over the events table per slice).
func (a *Auditor) uncarriedDelays(ctx context.Context, o AuditOptions, plan []slice, uncarried []uint64, delays map[int64]uint64) error {
	var total uint64
	for _, n := range uncarried {
		total += n
	}
	if total == 0 {
		return nil
	}
	uncarriedPlays := `SELECT %s FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND %s AND event_at_ms = 0`
	if total <= a.limits.SliceReports {
		ids := fmt.Sprintf(uncarriedPlays, "report_id", "1 = 1")
		return a.uncarriedDelaysOf(withCheck(ctx, o, "delay of plays without their event's time"), o,
			"report_id IN ("+ids+")", "", fmt.Sprintf(uncarriedPlays, "event_id", "1 = 1"), delays)
	}
	for i, s := range plan {
		if uncarried[i] == 0 {
			continue
		}
		rng := sliceRange(s.lo, s.hi)
		sctx := withCheck(ctx, o, fmt.Sprintf("delay of plays without their event's time, slice %d/%d (%s)", i+1, len(plan), s))
		if err := a.uncarriedDelaysOf(sctx, o, rng, a.joinFilter(o, s), fmt.Sprintf(uncarriedPlays, "event_id", rng), delays); err != nil {
			return err
		}
	}
	return nil
}

// uncarriedDelaysOf adds the delays of the delivered plays without a
// carried time among the plays whose report id meets rng (their Delivery
// records: rng and filter), their events among those of eventIDs.
func (a *Auditor) uncarriedDelaysOf(ctx context.Context, o AuditOptions, rng, filter, eventIDs string, delays map[int64]uint64) error {
	var keys []int64
	var counts []uint64
	err := a.row(ctx, `SELECT
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)]), 1),
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)]), 2)
FROM (SELECT event_id, delivered_ms FROM (`+a.perReportRows(o, rng, filter, fmt.Sprintf("uniqUpToIf(%d)", a.limits.countsUpTo()))+`) AS per_report
      WHERE `+condDelivered+` AND carried_ms = 0) AS delivered_plays
ALL INNER JOIN
    (SELECT event_id, min(kafka_time_ms) AS event_ms FROM `+a.db+`.events
     WHERE event_id != '' AND event_id IN (`+eventIDs+`)`+asOf(o)+`
     GROUP BY event_id) AS first_events
USING event_id`, &keys, &counts)
	if err != nil {
		return fmt.Errorf("analytics: audit delay of plays without their event's time: %w", err)
	}
	addDelays(delays, keys, counts)
	return nil
}

// earlierEventRecords corrects the delays the slices took from the
// carried times (delays, ms → plays) for the plays whose event has an
// earlier record in the events table than the earliest time their window
// rows carry. Such an event's records differ in time, so the events are
// first narrowed, in one pass over the events table, to those whose
// records' times differ: grouped by a 64-bit hash of the event id (a
// cheap key; a hash shared by two events only adds events to look at),
// the hashes whose group's earliest and latest times differ. The window's
// plays of those events are then grouped with their Delivery records, and
// each delivered play's delay moved from its carried time to its event's
// first record.
func (a *Auditor) earlierEventRecords(ctx context.Context, o AuditOptions, delays map[int64]uint64) error {
	asof := asOf(o)
	recorded := `SELECT cityHash64(event_id) FROM ` + a.db + `.events WHERE event_id != ''` + asof + `
         GROUP BY cityHash64(event_id) HAVING min(kafka_time_ms) != max(kafka_time_ms)`
	reports := `report_id IN (SELECT report_id FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND event_at_ms > 0
         AND cityHash64(event_id) IN (` + recorded + `))`
	var carried, first []int64
	var carriedN, firstN []uint64
	err := a.row(ctx, `SELECT
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(carried_ms)], [toUInt64(1)]), 1),
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(carried_ms)], [toUInt64(1)]), 2),
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)]), 1),
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)]), 2)
FROM (SELECT event_id, delivered_ms, carried_ms FROM (`+a.perReportRows(o, reports, "", fmt.Sprintf("uniqUpToIf(%d)", a.limits.countsUpTo()))+`) AS per_report
      WHERE `+condDelivered+` AND carried_ms > 0) AS delivered_plays
ALL INNER JOIN
    (SELECT event_id, min(kafka_time_ms) AS event_ms FROM `+a.db+`.events
     WHERE event_id != '' AND cityHash64(event_id) IN (`+recorded+`)`+asof+`
     GROUP BY event_id) AS first_events
USING event_id
WHERE event_ms < carried_ms`, &carried, &carriedN, &first, &firstN)
	if err != nil {
		return fmt.Errorf("analytics: audit delay, events recorded more than once: %w", err)
	}
	for j, k := range carried {
		if j < len(carriedN) {
			if delays[k] < carriedN[j] {
				return fmt.Errorf("analytics: audit delay, events recorded more than once: %d plays of delay %d ms to correct, the slices counted %d (the ledger changed under the snapshot?)", carriedN[j], k, delays[k])
			}
			delays[k] -= carriedN[j]
		}
	}
	addDelays(delays, first, firstN)
	return nil
}
