package analytics

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"
)

// The delay (docs/audit.md, "The delay"): from the first record of a
// delivered play's event to the play's first `delivered` answer. The first
// record is the earliest of the event's records in the events table (as
// of the snapshot) and of the event record times the play's window rows
// carry (plays.event_at_ms, the Kafka timestamp of the event record the
// consumer derived the play from; 0 in rows written before the column
// existed). A play whose event is in neither has no delay.
//
// The slices read the carried time with the play: no pass over the events
// table per slice (it is sorted by record time, not by anything a slice of
// report ids selects). The carried time is the event's first record unless
// the event has an earlier record than the ones the play's rows carry: then
// the event was recorded at least twice, at different times. Those events
// are listed once per audit (eventsRecordedTwice: one query, two passes
// over the events table) and handed to the slice queries whose plays they
// have (splitRecordedTwice) with their first record times. The narrow
// form of the slices gets the plays whose rows carry only a later record's
// time (firstRecords.fix), lists them and their delays are taken in Go; the
// wide form, and a slice with more such plays than maxLookups, gets the
// events as constant arrays (transform). When they are too many for a
// query, the slices join the events table instead (a pass over it per
// slice, as before). The plays that carry no time (rows written before the
// column existed) come back from the slice query with their events, which
// are then looked up in batches (a pass over the events table per batch of
// maxLookups events); a slice with more such plays than maxLookups joins
// the events table for them itself.
//
// The one case this cannot see: a play that carries the time of an event
// record missing from the events table (a sink that never copied it)
// while the table holds another record of the same event, at another
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

const (
	// maxRecordedTwice bounds the events recorded twice handed to the
	// slice queries as constants (and maxRecordedTwiceBytes their ids'
	// length), maxLookups the events looked up in one query by their ids.
	maxRecordedTwice      = 200_000
	maxRecordedTwiceBytes = 8 << 20
	maxLookups            = 50_000
	// maxQuerySize is the audit queries' max_query_size: room for those
	// constants.
	maxQuerySize = 32 << 20
)

// firstRecords are the events whose records' times differ, with their
// first record's time, for the slice queries; join when there are more than
// fit in a query (the slices then join the events table).
type firstRecords struct {
	ids  []string
	ms   []uint64
	join bool
	// fixed: the narrow form (audit_fast.go) leaves the lookup of ids out
	// of its rows, and fix holds what that changes: the plays of the
	// slice whose event is one of ids, whose rows carry an event time
	// (the earliest of them, carried) and whose event's first record is
	// earlier; by report id, that first record's time. The narrow form
	// lists these plays and their delays are taken from fix
	// (addFixedDelays). Set by splitRecordedTwice when a slice has at most
	// maxLookups such plays.
	fixed bool
	fix   map[string]uint64
}

// eventsRecordedTwice lists the events whose records (as of the snapshot)
// differ in time. The events are first narrowed by a 64-bit hash of their
// id (a cheap key: the hashes whose group's earliest and latest times
// differ; a hash shared by two events only adds events to look at), then
// grouped by id.
func (a *Auditor) eventsRecordedTwice(ctx context.Context, o AuditOptions) (firstRecords, error) {
	if a.limits.recordedTwice < 0 { // the tests: the slices join the events table
		return firstRecords{join: true}, nil
	}
	asof := asOf(o)
	var x firstRecords
	size := 0
	err := a.query(withCheck(ctx, o, "delay, events recorded more than once"), `SELECT event_id, min(kafka_time_ms) FROM `+a.db+`.events
WHERE event_id != '' AND cityHash64(event_id) IN (SELECT cityHash64(event_id) FROM `+a.db+`.events WHERE event_id != ''`+asof+`
    GROUP BY cityHash64(event_id) HAVING min(kafka_time_ms) != max(kafka_time_ms))`+asof+`
GROUP BY event_id HAVING min(kafka_time_ms) != max(kafka_time_ms)
LIMIT `+strconv.Itoa(a.limits.maxRecordedTwice()+1), func(rows driver.Rows) error {
		var id string
		var ms uint64
		if err := rows.Scan(&id, &ms); err != nil {
			return err
		}
		if size += len(id); size > maxRecordedTwiceBytes || len(x.ids) == a.limits.maxRecordedTwice() {
			x.join = true
			return nil
		}
		x.ids, x.ms = append(x.ids, id), append(x.ms, ms)
		return nil
	})
	if err != nil {
		return x, fmt.Errorf("analytics: audit delay, events recorded more than once: %w", err)
	}
	if x.join {
		x.ids, x.ms = nil, nil
	}
	return x, nil
}

// splitRecordedTwice is x for each slice of plan: the events recorded
// twice that have plays of the window in the slice. Every slice query
// matches its plays' events against the events it is handed, so handing
// each slice all of them cost O(slices × events): the time per million
// plays grew with the ledger. One pass over the window's plays finds the
// report ids' slices of each such event, and each play's carried time
// (firstRecords.fix).
func (a *Auditor) splitRecordedTwice(ctx context.Context, o AuditOptions, x firstRecords, plan []slice) ([]firstRecords, error) {
	out := make([]firstRecords, len(plan))
	if len(plan) == 1 || x.join || len(x.ids) == 0 {
		for i := range out {
			out[i] = x
		}
		return out, nil
	}
	first := make(map[string]uint64, len(x.ids))
	for i, id := range x.ids {
		first[id] = x.ms[i]
	}
	bounds := make([]string, len(plan))
	for i, s := range plan {
		bounds[i] = fmt.Sprintf("%02x", s.lo)
	}
	seen := make([]map[string]bool, len(plan))
	for i := range plan {
		seen[i], out[i].fix = map[string]bool{}, map[string]uint64{}
	}
	err := a.query(withCheck(ctx, o, fmt.Sprintf("delay, the slices of %d events recorded more than once", len(x.ids))),
		`SELECT report_id, any(event_id), minIf(event_at_ms, event_at_ms > 0) FROM `+a.db+`.plays
WHERE `+window(o)+` AND event_id IN (SELECT arrayJoin(`+stringArray(x.ids)+`))
GROUP BY report_id`, func(rows driver.Rows) error {
			var report, id string
			var carried uint64
			if err := rows.Scan(&report, &id, &carried); err != nil {
				return err
			}
			ms, ok := first[id]
			if !ok {
				return nil
			}
			// The slice whose range (sliceRange: report_id ≥ its lower
			// bound, < the next one's) holds the report id.
			i := max(0, sort.SearchStrings(bounds, report[:min(2, len(report))]+"\x00")-1)
			if !seen[i][id] {
				seen[i][id] = true
				out[i].ids, out[i].ms = append(out[i].ids, id), append(out[i].ms, ms)
			}
			if carried > 0 && ms < carried {
				out[i].fix[report] = ms
			}
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("analytics: audit delay, events recorded more than once: %w", err)
	}
	for i := range out {
		out[i].fixed = len(out[i].fix) <= a.limits.maxLookups()
		if !out[i].fixed {
			out[i].fix = nil
		}
	}
	return out, nil
}

// addFixedDelays adds the delays of the plays the narrow form listed
// (firstRecords.fix), each "delivered_ms report_id", from their events'
// first records.
func addFixedDelays(m map[int64]uint64, plays []string, fix map[string]uint64) error {
	for _, p := range plays {
		ms, id, _ := strings.Cut(p, " ")
		at, err := strconv.ParseInt(ms, 10, 64)
		first, ok := fix[id]
		if err != nil || !ok {
			return fmt.Errorf("analytics: audit delay: a play of an event recorded twice read as %q", p)
		}
		m[at-int64(first)]++
	}
	return nil
}

// sliceEvents is one row per play of the window in slice s (slicePerReport)
// with event_ms, the first record time of its event, where has_event = 1:
// an event recorded twice (x), or, when x.join, any event of the ledger.
func (a *Auditor) sliceEvents(o AuditOptions, s slice, uniq string, x firstRecords) string {
	rows := a.slicePerReport(o, s, uniq)
	switch {
	case x.join:
		return `(` + rows + `) AS per_report
ALL LEFT JOIN
    (SELECT event_id, min(kafka_time_ms) AS event_ms, toUInt8(1) AS has_event FROM ` + a.db + `.events
     WHERE event_id != '' AND event_id IN (SELECT event_id FROM ` + a.db + `.plays WHERE ` + window(o) + ` AND ` + sliceRange(s.lo, s.hi) + `)` + asOf(o) + `
     GROUP BY event_id) AS first_events
USING event_id`
	case len(x.ids) == 0:
		return `(SELECT *, toUInt64(0) AS event_ms, toUInt8(0) AS has_event FROM (` + rows + `)) AS per_report`
	}
	return `(SELECT *, ` + x.transform("event_id") + ` AS event_ms, toUInt8(event_ms > 0) AS has_event FROM (` + rows + `)) AS per_report`
}

// transform is the SQL of the first record time of the event whose id is
// the column id when x lists it, else 0.
func (x firstRecords) transform(id string) string {
	var b strings.Builder
	b.WriteString(`transform(` + id + `, ` + stringArray(x.ids) + `, [`)
	for i, ms := range x.ms {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(ms, 10))
	}
	b.WriteString(`], toUInt64(0))`)
	return b.String()
}

// stringArray is the SQL array literal of ss: one literal however long
// (a list of values, IN ('a', 'b', …), is an expression per value, and the
// server refuses more than max_ast_elements, 50 000).
func stringArray(ss []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quoteSQL(s))
	}
	b.WriteByte(']')
	return b.String()
}

// uncarriedCond selects the delivered plays that carry no event record time
// and whose event's first record the slice query does not know: looked up
// afterwards (none when the slice joins the events table).
func uncarriedCond(x firstRecords) string {
	if x.join {
		return "0"
	}
	return condDelivered + " AND carried_ms = 0 AND has_event = 0"
}

// lookups are delivered plays whose events are looked up by id
// (uncarriedCond): per event, the times of their first delivery.
type lookups struct {
	delivered map[string][]int64
}

// add adds the plays of a slice query, each "delivered_ms event_id".
func (l *lookups) add(plays []string) error {
	if l.delivered == nil {
		l.delivered = map[string][]int64{}
	}
	for _, p := range plays {
		ms, id, ok := strings.Cut(p, " ")
		at, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil {
			return fmt.Errorf("analytics: audit delay: a play without its event's time read as %q", p)
		}
		l.delivered[id] = append(l.delivered[id], at)
	}
	return nil
}

// flush looks the events up (when at least maxLookups, or any when all),
// and adds the plays' delays.
func (a *Auditor) flush(ctx context.Context, o AuditOptions, l *lookups, all bool, delays map[int64]uint64) error {
	if len(l.delivered) == 0 || !all && len(l.delivered) < a.limits.maxLookups() {
		return nil
	}
	ids := make([]string, 0, len(l.delivered))
	for id := range l.delivered {
		ids = append(ids, id)
	}
	err := a.query(withCheck(ctx, o, fmt.Sprintf("delay, the events of %d plays without their event's time", len(l.delivered))),
		`SELECT event_id, min(kafka_time_ms) FROM `+a.db+`.events WHERE event_id IN (SELECT arrayJoin(`+stringArray(ids)+`))`+asOf(o)+` GROUP BY event_id`,
		func(rows driver.Rows) error {
			var id string
			var ms uint64
			if err := rows.Scan(&id, &ms); err != nil {
				return err
			}
			for _, at := range l.delivered[id] {
				delays[at-int64(ms)]++
			}
			return nil
		})
	if err != nil {
		return fmt.Errorf("analytics: audit delay of plays without their event's time: %w", err)
	}
	l.delivered = nil
	return nil
}

// sliceUncarriedDelays adds the delays of slice s's delivered plays of
// uncarriedCond(x) when the slice has more than maxLookups: their events
// joined from the events table.
func (a *Auditor) sliceUncarriedDelays(ctx context.Context, o AuditOptions, s slice, x firstRecords, delays map[int64]uint64) error {
	var keys []int64
	var counts []uint64
	err := a.row(ctx, `SELECT
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)]), 1),
    tupleElement(sumMap([toInt64(delivered_ms) - toInt64(event_ms)], [toUInt64(1)]), 2)
FROM (SELECT event_id, delivered_ms FROM `+a.sliceEvents(o, s, fmt.Sprintf("uniqUpToIf(%d)", a.limits.countsUpTo()), x)+`
      WHERE `+uncarriedCond(x)+`) AS delivered_plays
ALL INNER JOIN
    (SELECT event_id, min(kafka_time_ms) AS event_ms FROM `+a.db+`.events
     WHERE event_id != '' AND event_id IN (SELECT event_id FROM `+a.db+`.plays WHERE `+window(o)+` AND `+sliceRange(s.lo, s.hi)+` AND event_at_ms = 0)`+asOf(o)+`
     GROUP BY event_id) AS first_events
USING event_id`, &keys, &counts)
	if err != nil {
		return fmt.Errorf("analytics: audit delay of plays without their event's time, %s: %w", s, err)
	}
	addDelays(delays, keys, counts)
	return nil
}
