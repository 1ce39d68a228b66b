package replay

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// selPlay is one play record of the selection test's ledger.
type selPlay struct {
	reportID, eventID string
	partition         int32
	offset            int64
	derivedMS         int64 // kafka_time_ms
	playedMS          int64
	below             bool
	topic             string
}

// selAnswer is one delivery record.
type selAnswer struct {
	reportID, outcome, servedBy, replayID, message string
	status                                         int32
	atMS                                           int64
	doubtCause                                     string // a post in doubt
}

// TestSelectReportsOnEveryLedger: the replay and redrive selections of
// selectReports, on a random ledger, equal the selection computed in Go
// from the package documentation's rules, on every ledger backend (18.16,
// and current ClickHouse through chdb with -tags chdb).
func TestSelectReportsOnEveryLedger(t *testing.T) {
	testenv.ForEachLedger(t, func(t *testing.T, l *testenv.Ledger) {
		ctx := context.Background()
		if _, err := analytics.Migrate(ctx, l.Conn, l.Database); err != nil {
			t.Fatal(err)
		}
		kc := kafkax.Config{Brokers: []string{"127.0.0.1:1"}, TopicPrefix: "plays"}
		reports := kc.Topics().Reports
		base := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC).UnixMilli()
		hour := int64(time.Hour / time.Millisecond)
		rng := rand.New(rand.NewPCG(21, 12))
		var plays []selPlay
		var answers []selAnswer
		var offset int64
		for i := range 120 {
			ev := fmt.Sprintf("ev%03d", i)
			rid := schemas.ReportID(ev, 0)
			p := selPlay{reportID: rid, eventID: ev, partition: int32(rng.IntN(3)), derivedMS: base + rng.Int64N(10*hour),
				playedMS: base + rng.Int64N(10*hour), below: rng.IntN(10) == 0, topic: reports}
			offset++
			p.offset = offset
			plays = append(plays, p)
			if rng.IntN(6) == 0 { // re-derived: a second record, later, elsewhere
				q := p
				offset++
				q.partition, q.offset, q.derivedMS = int32(rng.IntN(3)), offset, p.derivedMS+rng.Int64N(3*hour)
				plays = append(plays, q)
			}
			if rng.IntN(25) == 0 { // a record of another topic prefix's reports: never selected
				q := p
				offset++
				q.topic, q.offset = "other.reports", offset
				plays = append(plays, q)
			}
			at := p.derivedMS + 1000
			answer := func(outcome, servedBy, replayID, msg string, status int32) {
				answers = append(answers, selAnswer{reportID: rid, outcome: outcome, servedBy: servedBy, replayID: replayID, message: msg, status: status, atMS: at})
				at += rng.Int64N(hour)
			}
			switch rng.IntN(11) {
			case 0: // pending
			case 1:
				answer(schemas.OutcomeStandby, "standby", "", "", 200)
				answer(schemas.OutcomeDelivered, "", "", "", 200)
			case 2:
				answer(schemas.OutcomeDelivered, "standby", "", "", 200) // delivered by the standby
			case 3:
				answer(schemas.OutcomeRejected, "", "", "isrc is invalid", 400)
			case 4:
				answer(schemas.OutcomeRejected, "", "", "bad country", 400)
				answer(schemas.OutcomeDelivered, "", "rp-old", "", 200) // redriven already
			case 5:
				answer(schemas.OutcomeDelivered, "", "", "", 200)
				answer(schemas.OutcomeDelivered, "", "rp-x", "", 200) // this replay id did it
			case 6:
				answer(schemas.OutcomeRejected, "", "", "isrc is invalid", 400)
				answer(schemas.OutcomeRejected, "", "rp-x", "isrc is invalid", 400)
			case 7:
				answer(schemas.OutcomeRetry, "", "", "internal service error", 500)
				if rng.IntN(2) == 0 { // a post of it in doubt: the redrive's records say in_doubt
					answers[len(answers)-1].doubtCause = schemas.DoubtTimeout
				}
				answer(schemas.OutcomeParked, "", "", "internal service error", 500) // parked: redrive --parked selects it
			case 8:
				answer(schemas.OutcomeParked, "", "", "internal service error", 500)
				answer(schemas.OutcomeDelivered, "", "", "", 200) // a slow retry delivered it
			default:
				answer(schemas.OutcomeDelivered, "", "", "", 200)
			}
		}
		insertSel(t, l, plays, answers)

		cfg := Config{Kafka: kc, CH: l.Conn, Database: l.Database, ReplayID: "rp-x"}
		win := func(a, b int) (time.Time, time.Time) {
			return time.UnixMilli(base + int64(a)*hour).UTC(), time.UnixMilli(base + int64(b)*hour).UTC()
		}
		f, to := win(2, 7)
		var some []string
		for _, p := range plays[:40] {
			some = append(some, p.reportID)
		}
		sels := []Selection{
			{Kind: KindReplay, By: ByEvent, From: f, To: to},
			{Kind: KindReplay, By: ByDerived, From: f, To: to},
			{Kind: KindReplay, By: ByDelivered, From: f, To: to},
			{Kind: KindReplay, By: ByDelivered, From: f, To: to, OnlyStandby: true},
			{Kind: KindReplay, By: ByDerived, From: f, To: to, OnlyStandby: true},
			{Kind: KindReplay, By: ByEvent, ReportIDs: some},
			{Kind: KindRedrive},
			{Kind: KindRedrive, From: f, To: to, Messages: []string{"isrc is invalid"}},
			{Kind: KindRedrive, ReportIDs: some},
			{Kind: KindRedrive, Parked: true},
			{Kind: KindRedrive, Parked: true, From: f, To: to},
		}
		for _, sel := range sels {
			got, err := selectReports(ctx, cfg, sel)
			if err != nil {
				t.Fatalf("%+v: %v", sel, err)
			}
			want := expectSelection(plays, answers, reports, cfg.ReplayID, sel)
			if len(want) == 0 {
				t.Fatalf("%+v: the test's ledger selects nothing", sel)
			}
			t.Logf("%s by %q from %s standby %v, %d ids, %d messages: %d reports", sel.Kind, sel.By, sel.From.Format(time.TimeOnly), sel.OnlyStandby, len(sel.ReportIDs), len(sel.Messages), len(got))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("%+v on %s:\n got %d %+v\nwant %d %+v", sel, l.Version, len(got), got, len(want), want)
			}
		}
	})
}

// expectSelection applies the selection rules (replay.go, select.go's
// documentation) to the test's ledger in Go.
func expectSelection(plays []selPlay, answers []selAnswer, reports, replayID string, sel Selection) []item {
	in := func(ms int64) bool {
		return (sel.From.IsZero() || ms >= sel.From.UnixMilli()) && (sel.To.IsZero() || ms < sel.To.UnixMilli())
	}
	has := func(rid string, f func(a selAnswer) bool) bool {
		return slices.ContainsFunc(answers, func(a selAnswer) bool { return a.reportID == rid && f(a) })
	}
	standby := func(a selAnswer) bool { return a.outcome == schemas.OutcomeStandby || a.servedBy == "standby" }
	liveDelivered := func(a selAnswer) bool { return a.outcome == schemas.OutcomeDelivered && a.replayID == "" }
	type acc struct {
		it    item
		below bool
	}
	by := map[string]*acc{}
	var order []string
	for _, p := range plays {
		ok := p.topic == reports && (len(sel.ReportIDs) == 0 || slices.Contains(sel.ReportIDs, p.reportID)) &&
			!has(p.reportID, func(a selAnswer) bool {
				return a.replayID == replayID && (a.outcome == schemas.OutcomeDelivered || a.outcome == schemas.OutcomeRejected)
			})
		switch sel.Kind {
		case KindReplay:
			ok = ok && has(p.reportID, liveDelivered)
			switch sel.By {
			case ByEvent:
				ok = ok && in(p.playedMS)
			case ByDerived:
				ok = ok && in(p.derivedMS)
			case ByDelivered:
				c := liveDelivered
				if sel.OnlyStandby {
					c = standby
				}
				ok = ok && has(p.reportID, func(a selAnswer) bool { return c(a) && in(a.atMS) })
			}
			if sel.OnlyStandby && sel.By != ByDelivered {
				ok = ok && has(p.reportID, standby)
			}
		case KindRedrive:
			if sel.Parked {
				ok = ok && has(p.reportID, func(a selAnswer) bool { return a.outcome == schemas.OutcomeParked && in(a.atMS) }) &&
					!has(p.reportID, func(a selAnswer) bool {
						return a.outcome == schemas.OutcomeDelivered || a.outcome == schemas.OutcomeRejected
					})
				break
			}
			ok = ok && has(p.reportID, func(a selAnswer) bool {
				return a.outcome == schemas.OutcomeRejected && a.status == 400 && in(a.atMS) &&
					(len(sel.Messages) == 0 || slices.Contains(sel.Messages, a.message))
			}) && !has(p.reportID, func(a selAnswer) bool { return a.outcome == schemas.OutcomeDelivered })
		}
		if !ok {
			continue
		}
		c := by[p.reportID]
		if c == nil {
			c = &acc{it: item{reportID: p.reportID, eventID: p.eventID, partition: p.partition, offset: p.offset, timeMS: p.derivedMS}}
			by[p.reportID] = c
			order = append(order, p.reportID)
		}
		if p.offset < c.it.offset {
			c.it.partition, c.it.offset = p.partition, p.offset
		}
		c.it.timeMS = min(c.it.timeMS, p.derivedMS)
		c.it.inDoubt = sel.Kind == KindRedrive && sel.Parked &&
			has(p.reportID, func(a selAnswer) bool { return a.replayID == "" && a.doubtCause != "" })
		c.below = c.below || p.below
	}
	var out []item
	for _, id := range order {
		if !by[id].below {
			out = append(out, by[id].it)
		}
	}
	slices.SortFunc(out, func(a, b item) int { return cmp.Compare(a.reportID, b.reportID) })
	return out
}

// insertSel writes the plays and answers through the driver's batches.
func insertSel(t *testing.T, l *testenv.Ledger, plays []selPlay, answers []selAnswer) {
	t.Helper()
	ctx := context.Background()
	b, err := l.Conn.PrepareBatch(ctx, "INSERT INTO "+l.Database+".plays (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, report_id, event_id, played_at_ms, below_minimum)")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plays {
		if err := b.Append(p.topic, p.partition, p.offset, time.UnixMilli(p.derivedMS), uint64(p.derivedMS), p.reportID, p.eventID, p.playedMS, uint8(b2u(p.below))); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
	b, err = l.Conn.PrepareBatch(ctx, "INSERT INTO "+l.Database+".deliveries (kafka_topic, kafka_partition, kafka_offset, kafka_time, kafka_time_ms, report_id, outcome, served_by, replay_id, message, http_status, at_ms, doubt_cause)")
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range answers {
		if err := b.Append("plays.deliveries", int32(0), int64(i), time.UnixMilli(a.atMS), uint64(a.atMS), a.reportID, a.outcome, a.servedBy, a.replayID, a.message, a.status, a.atMS, a.doubtCause); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Send(); err != nil {
		t.Fatal(err)
	}
}

func b2u(b bool) int {
	if b {
		return 1
	}
	return 0
}
