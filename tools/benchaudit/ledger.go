package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2/lib/driver"

	"github.com/playpipe/playpipe/analytics"
)

// The synthetic ledger: play j (0 ≤ j < n) belongs to event j/5 (5 plays
// an event), is recorded at base + j·step + 1 s, and its fate is fixed by
// j (the rules below, mirrored by the SQL of generate and by truth):
//
//	j % 50 == 7     below the minimum: no delivery
//	j % 100 == 3    pending: no delivery yet
//	j % 1000 == 23  parked: one parked answer, none final
//	j % 200 == 17   rejected by the API (400)
//	otherwise       delivered once (at its record time + 300 ms + j % 1000 ms), and also:
//	  j % 1000 == 11  delivered a second time (a double)
//	  j % 1000 == 13  delivered in doubt after a post that timed out
//	  j % 500 == 19   delivered again by replay rp-bench
//
// Event i is recorded at base + 5·i·step; every play carries that time
// (plays.event_at_ms, as the consumer stamps it), but for:
//
//	j % 1000 == 29  a play written before the column existed: 0
//	i % 100 == 3    the event recorded a second time 5 s later (the
//	                player sent it again), its plays derived again from
//	                that record: a second row each, 5 s later, carrying
//	                the later time; when i % 200 == 3 the first rows were
//	                written before the column existed (0), so the plays
//	                carry only the later time (their delays, if taken
//	                from it, would move the quantiles)
//
// so the audit's delay takes the carried time for most plays, looks the
// events of the old rows up, and corrects the plays of events recorded
// twice: every delay from the event's first record, as truth computes it.
type ledgerTruth struct {
	n              int
	baseMS, stepMS int64
	from, to, now  time.Time
}

const (
	condBelow   = "number % 50 = 7"
	condPending = "number % 100 = 3"
	condParked  = "number % 1000 = 23"
	condReject  = "number % 200 = 17"
	condTwice   = "number % 1000 = 11"
	condDoubt   = "number % 1000 = 13"
	condReplay  = "number % 500 = 19"
	condOldRow  = "number % 1000 = 29"
	// Of an event (number: the event's index i).
	condTwiceRecorded = "number % 100 = 3"
	condFirstOld      = "number % 200 = 3"
	// The second record's lateness.
	againMS = 5000
)

// counts are the seeded figures of a window.
type counts struct {
	events, plays, records, below, pending, parked, rejected, delivered, twice, doubt, replayed uint64
	delays                                                                                      map[int64]uint64 // delay ms → delivered plays
}

func (l ledgerTruth) playMS(j int) int64  { return l.baseMS + int64(j)*l.stepMS + 1000 }
func (l ledgerTruth) eventMS(i int) int64 { return l.baseMS + int64(5*i)*l.stepMS }

// twiceRecorded tells whether event i was recorded a second time.
func twiceRecorded(i int) bool { return i%100 == 3 }

// truth counts the seeded figures of the window [from, to): a play is in
// the window when one of its rows is.
func (l ledgerTruth) truth() counts {
	c := counts{delays: map[int64]uint64{}}
	lo, hi := l.from.UnixMilli(), l.to.UnixMilli()
	in := func(t int64) bool { return t >= lo && t < hi }
	for i := 0; i < (l.n+4)/5; i++ {
		if in(l.eventMS(i)) {
			c.events++
		}
		if twiceRecorded(i) && in(l.eventMS(i)+againMS) {
			c.events++
		}
	}
	for j := 0; j < l.n; j++ {
		rows := 0
		if in(l.playMS(j)) {
			rows++
		}
		if twiceRecorded(j/5) && in(l.playMS(j)+againMS) {
			rows++
		}
		if rows == 0 {
			continue
		}
		c.plays++
		c.records += uint64(rows)
		switch {
		case j%50 == 7:
			c.below++
		case j%100 == 3:
			c.pending++
		case j%1000 == 23:
			c.pending++
			c.parked++
		case j%200 == 17:
			c.rejected++
		default:
			c.delivered++
			c.delays[l.playMS(j)+300+int64(j%1000)-l.eventMS(j/5)]++
			switch {
			case j%1000 == 11:
				c.twice++
			case j%1000 == 13:
				c.doubt++
			}
			if j%500 == 19 {
				c.replayed++
			}
		}
	}
	return c
}

// delayOf is the Delay of a multiset of delays (ms → plays) by
// quantilesExact's rule: the value at ⌊level·n⌋ of the sorted values.
func delayOf(m map[int64]uint64) analytics.Delay {
	var d analytics.Delay
	keys := make([]int64, 0, len(m))
	for k, n := range m {
		keys = append(keys, k)
		d.Plays += n
	}
	if d.Plays == 0 {
		return d
	}
	slices.Sort(keys)
	at := func(level float64) float64 {
		idx, seen := uint64(level*float64(d.Plays)), uint64(0)
		for _, k := range keys {
			if seen += m[k]; idx < seen {
				return float64(k)
			}
		}
		return float64(keys[len(keys)-1])
	}
	d.P50MS, d.P90MS, d.P99MS, d.MaxMS = at(0.5), at(0.9), at(0.99), float64(keys[len(keys)-1])
	return d
}

// check compares an audit with the seeded figures: "ok" or what differs.
func (l ledgerTruth) check(r *analytics.Audit) string {
	c := l.truth()
	var replayed uint64
	for _, rp := range r.Replays {
		replayed += rp.Plays
	}
	var bad []string
	for _, f := range []struct {
		name      string
		got, want uint64
	}{
		{"events received", r.EventsReceived, c.events},
		{"events without plays", r.EventsWithoutPlays, 0},
		{"plays derived", r.PlaysDerived, c.plays},
		{"play records", r.PlayRecords, c.records},
		{"below minimum", r.PlaysBelowMinimum, c.below},
		{"reportable", r.PlaysReportable, c.plays - c.below},
		{"delivered", r.Delivered, c.delivered},
		{"rejected by the API", r.RejectedByAPI, c.rejected},
		{"pending", r.Pending, c.pending},
		{"pending overdue", r.PendingOverdue, c.pending},
		{"parked", r.Parked, c.parked},
		{"delivered more than once", r.DeliveredTwice, c.twice},
		{"possibly delivered twice", r.PossiblyTwice, c.doubt},
		{"possible extra copies", r.PossibleExtraCopies, c.twice + c.doubt},
		{"plays re-sent by replay", replayed, c.replayed},
		{"delay over plays", r.Delay.Plays, c.delivered},
	} {
		if f.got != f.want {
			bad = append(bad, fmt.Sprintf("%s %d, seeded %d", f.name, f.got, f.want))
		}
	}
	if want := delayOf(c.delays); r.Delay != want {
		bad = append(bad, fmt.Sprintf("delay %+v, seeded %+v", r.Delay, want))
	}
	if len(bad) > 0 {
		return "WRONG: " + strings.Join(bad, "; ")
	}
	return fmt.Sprintf("ok (%d plays, %d delivered, %d twice, %d in doubt, %d pending, %d parked, %d replayed, delay p50 %.0f ms)", c.plays, c.delivered, c.twice, c.doubt, c.pending, c.parked, c.replayed, r.Delay.P50MS)
}

// ledgerOf is the synthetic ledger of n plays over days whose first event
// is recorded at baseMS.
func ledgerOf(n, days int, baseMS int64) ledgerTruth {
	spanMS := int64(days) * 24 * 3600 * 1000
	l := ledgerTruth{n: n, stepMS: spanMS / int64(n), baseMS: baseMS}
	l.to = time.UnixMilli(l.playMS(n-1) + 3600*1000).UTC()
	l.from, l.now = time.UnixMilli(l.baseMS).UTC(), l.to
	return l
}

// twiceRecordedEvents is the number of events of n plays recorded twice.
func twiceRecordedEvents(n int) int {
	k := 0
	for i := 3; i < (n+4)/5; i += 100 {
		k++
	}
	return k
}

// twiceDerivedPlays is the number of plays of n derived a second time.
func twiceDerivedPlays(n int) int {
	k := 0
	for i := 3; i < (n+4)/5; i += 100 {
		k += min(5, n-5*i)
	}
	return k
}

// reuse is the ledger of n plays over days already in database db (made
// by an earlier run with -keep), ok false when db holds no such ledger.
func reuse(ctx context.Context, conn driver.Conn, db string, n, days int) (ledgerTruth, bool) {
	var plays, events uint64
	var baseMS uint64
	if err := conn.QueryRow(ctx, "SELECT (SELECT count() FROM "+db+".plays), count(), min(kafka_time_ms) FROM "+db+".events").Scan(&plays, &events, &baseMS); err != nil ||
		plays != uint64(n+twiceDerivedPlays(n)) || events != uint64((n+4)/5+twiceRecordedEvents(n)) {
		return ledgerTruth{}, false
	}
	return ledgerOf(n, days, int64(baseMS)), true
}

// generate makes the ledger database db of n plays spread over days.
func generate(ctx context.Context, conn driver.Conn, db string, n, days int) (ledgerTruth, error) {
	now := time.Now().UTC().Truncate(time.Hour)
	spanMS := int64(days) * 24 * 3600 * 1000
	l := ledgerOf(n, days, now.UnixMilli()-spanMS-2*3600*1000)
	if _, err := analytics.Migrate(ctx, conn, db); err != nil {
		return l, err
	}
	base, step := strconv.FormatInt(l.baseMS, 10), strconv.FormatInt(l.stepMS, 10)
	playT := "toUInt64(" + base + " + number * " + step + " + 1000)"
	reportID := "lower(hex(MD5(concat('ev-', toString(intDiv(number, 5)), '/', toString(number % 5)))))"
	eventID := "concat('ev-', toString(intDiv(number, 5)))"
	eventT := "toUInt64(" + base + " + 5 * intDiv(number, 5) * " + step + ")" // a play's event's first record
	ofEvent := strings.NewReplacer("number", "intDiv(number, 5)")             // a condition on the event of play number
	again, second := strconv.Itoa(againMS), "1000000000000"                   // the second record: later, at other offsets
	deliveries := "INSERT INTO " + db + `.deliveries (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, kafka_topic_id,
    v, report_id, event_id, outcome, attempt, http_status, served_by, message, retry_reason, trace_id, at_ms, partner, in_doubt, replay_id, replay_reason, doubt_cause)
SELECT 'bench.deliveries', toInt32(number % 6), toInt64(number * 4 + {off}), toDateTime(intDiv(t, 1000)), t, 'dtopic',
    1, ` + reportID + `, ` + eventID + `, {outcome}, 1, {status}, 'partner', {message}, '', '', toInt64(t - 200 + number % 1000), 'https://partner.example/', {doubt}, {replay}, {reason}, {cause}
FROM (SELECT number, ` + playT + ` + 500 AS t FROM numbers(` + strconv.Itoa(n) + `)) WHERE {where}`
	fill := func(kv ...string) string { return strings.NewReplacer(kv...).Replace(deliveries) }
	events := "INSERT INTO " + db + `.events (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, kafka_topic_id, kafka_key, trace_id, parsed, event_id, mix_id, started_at_ms, offset_ms, duration_ms, user_id, country, raw)
SELECT 'bench.events', toInt32(number % 6), toInt64(intDiv(number, 6)) + {off}, toDateTime(intDiv(t, 1000)), t, 'etopic', '', '', 1, concat('ev-', toString(number)), 1, 0, 0, 0, 'u', 'DE', ''
FROM (SELECT number, toUInt64(` + base + ` + 5 * number * ` + step + ` + {again}) AS t FROM numbers(` + strconv.Itoa((n+4)/5) + `)) WHERE {where}`
	fillEvents := func(kv ...string) string { return strings.NewReplacer(kv...).Replace(events) }
	plays := "INSERT INTO " + db + `.plays (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, kafka_topic_id,
    trace_id, v, report_id, event_id, mix_id, position, overlap_ms, below_minimum, no_user_id, standby_listing, derived_at_ms, track_id, played_at_ms, play_length, user_id, country, isrc, record, event_at_ms)
SELECT 'bench.reports', toInt32(number % 6), toInt64(intDiv(number, 6)) + {off}, toDateTime(intDiv(t, 1000)), t, 'rtopic',
    '', 1, ` + reportID + `, ` + eventID + `, 1, toInt32(number % 5), 0, toUInt8(` + condBelow + `), 0, 0, toInt64(t), 1, toInt64(t), 60000, 'u', 'DE', 'XX0000000000', '', {carried}
FROM (SELECT number, toUInt64(` + playT + ` + {again}) AS t FROM numbers(` + strconv.Itoa(n) + `)) WHERE {where}`
	fillPlays := func(kv ...string) string { return strings.NewReplacer(kv...).Replace(plays) }
	reportable := "NOT (" + condBelow + ") AND NOT (" + condPending + ")"
	stmts := []string{
		// The events; the second records of the events recorded twice.
		fillEvents("{off}", "0", "{again}", "0", "{where}", "1 = 1"),
		fillEvents("{off}", second, "{again}", again, "{where}", condTwiceRecorded),
		// The plays, each carrying its event's record time (0: an old
		// row); the plays derived again from an event's second record.
		fillPlays("{off}", "0", "{again}", "0", "{where}", "1 = 1",
			"{carried}", "if("+condOldRow+" OR "+ofEvent.Replace(condFirstOld)+", toUInt64(0), "+eventT+")"),
		fillPlays("{off}", second, "{again}", again, "{where}", ofEvent.Replace(condTwiceRecorded),
			"{carried}", eventT+" + "+again),
		// The final answer of every reportable play but the pending ones.
		fill("{off}", "0",
			"{outcome}", "multiIf("+condParked+", 'parked', "+condReject+", 'rejected', 'delivered')",
			"{status}", "toInt32(multiIf("+condParked+", 503, "+condReject+", 400, 200))",
			"{message}", "if("+condReject+", 'bad isrc', '')", "{doubt}", "toUInt8("+condDoubt+")",
			"{replay}", "''", "{reason}", "''", "{cause}", "''", "{where}", reportable),
		// The doubles, the timed-out posts before a delivery in doubt, the replays.
		fill("{off}", "1",
			"{outcome}", "if("+condDoubt+", 'retry', 'delivered')", "{status}", "toInt32(if("+condDoubt+", 0, 200))",
			"{message}", "''", "{doubt}", "toUInt8(0)",
			"{replay}", "if("+condReplay+", 'rp-bench', '')", "{reason}", "if("+condReplay+", 'bench replay', '')",
			"{cause}", "if("+condDoubt+", 'timeout', '')",
			"{where}", reportable+" AND NOT ("+condParked+") AND NOT ("+condReject+") AND ("+condTwice+" OR "+condDoubt+" OR "+condReplay+")"),
	}
	for _, st := range stmts {
		if err := conn.Exec(ctx, st); err != nil {
			return l, fmt.Errorf("%.80s…: %w", st, err)
		}
	}
	return l, nil
}
