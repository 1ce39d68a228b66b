package main

import (
	"context"
	"fmt"
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
//	otherwise       delivered once, and also:
//	  j % 1000 == 11  delivered a second time (a double)
//	  j % 1000 == 13  delivered in doubt after a post that timed out
//	  j % 500 == 19   delivered again by replay rp-bench
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
)

// counts are the seeded figures of a window.
type counts struct {
	events, plays, below, pending, parked, rejected, delivered, twice, doubt, replayed uint64
}

func (l ledgerTruth) playMS(j int) int64  { return l.baseMS + int64(j)*l.stepMS + 1000 }
func (l ledgerTruth) eventMS(i int) int64 { return l.baseMS + int64(5*i)*l.stepMS }

// truth counts the seeded figures of the window [from, to).
func (l ledgerTruth) truth() counts {
	var c counts
	lo, hi := l.from.UnixMilli(), l.to.UnixMilli()
	for i := 0; i < (l.n+4)/5; i++ {
		if t := l.eventMS(i); t >= lo && t < hi {
			c.events++
		}
	}
	for j := 0; j < l.n; j++ {
		if t := l.playMS(j); t < lo || t >= hi {
			continue
		}
		c.plays++
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
		{"play records", r.PlayRecords, c.plays},
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
	if len(bad) > 0 {
		return "WRONG: " + strings.Join(bad, "; ")
	}
	return fmt.Sprintf("ok (%d plays, %d delivered, %d twice, %d in doubt, %d pending, %d parked, %d replayed)", c.plays, c.delivered, c.twice, c.doubt, c.pending, c.parked, c.replayed)
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

// reuse is the ledger of n plays over days already in database db (made
// by an earlier run with -keep), ok false when db holds no such ledger.
func reuse(ctx context.Context, conn driver.Conn, db string, n, days int) (ledgerTruth, bool) {
	var plays, events uint64
	var baseMS uint64
	if err := conn.QueryRow(ctx, "SELECT (SELECT count() FROM "+db+".plays), count(), min(kafka_time_ms) FROM "+db+".events").Scan(&plays, &events, &baseMS); err != nil ||
		plays != uint64(n) || events != uint64((n+4)/5) {
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
	deliveries := "INSERT INTO " + db + `.deliveries (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, kafka_topic_id,
    v, report_id, event_id, outcome, attempt, http_status, served_by, message, retry_reason, trace_id, at_ms, partner, in_doubt, replay_id, replay_reason, doubt_cause)
SELECT 'bench.deliveries', toInt32(number % 6), toInt64(number * 4 + {off}), toDateTime(intDiv(t, 1000)), t, 'dtopic',
    1, ` + reportID + `, ` + eventID + `, {outcome}, 1, {status}, 'partner', {message}, '', '', toInt64(t - 200 + number % 1000), 'https://partner.example/', {doubt}, {replay}, {reason}, {cause}
FROM (SELECT number, ` + playT + ` + 500 AS t FROM numbers(` + strconv.Itoa(n) + `)) WHERE {where}`
	fill := func(kv ...string) string { return strings.NewReplacer(kv...).Replace(deliveries) }
	reportable := "NOT (" + condBelow + ") AND NOT (" + condPending + ")"
	stmts := []string{
		"INSERT INTO " + db + `.events (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, kafka_topic_id, kafka_key, trace_id, parsed, event_id, mix_id, started_at_ms, offset_ms, duration_ms, user_id, country, raw)
SELECT 'bench.events', toInt32(number % 6), toInt64(intDiv(number, 6)), toDateTime(intDiv(t, 1000)), t, 'etopic', '', '', 1, concat('ev-', toString(number)), 1, 0, 0, 0, 'u', 'DE', ''
FROM (SELECT number, toUInt64(` + base + ` + 5 * number * ` + step + `) AS t FROM numbers(` + strconv.Itoa((n+4)/5) + `))`,
		"INSERT INTO " + db + `.plays (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, kafka_topic_id,
    trace_id, v, report_id, event_id, mix_id, position, overlap_ms, below_minimum, no_user_id, standby_listing, derived_at_ms, track_id, played_at_ms, play_length, user_id, country, isrc, record)
SELECT 'bench.reports', toInt32(number % 6), toInt64(intDiv(number, 6)), toDateTime(intDiv(t, 1000)), t, 'rtopic',
    '', 1, ` + reportID + `, ` + eventID + `, 1, toInt32(number % 5), 0, toUInt8(` + condBelow + `), 0, 0, toInt64(t), 1, toInt64(t), 60000, 'u', 'DE', 'XX0000000000', ''
FROM (SELECT number, ` + playT + ` AS t FROM numbers(` + strconv.Itoa(n) + `))`,
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
