package analytics

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/schemas"
)

// The ledger suite's scenario: a random but reproducible mix of every kind
// of record the ledger holds (events valid and not, rejections republished,
// refusals at the gateway, plays re-derived, every outcome path, replays,
// doubts, sandbox and real partners, malformed records, records outside the
// window) as Kafka records, plus the facts the records say, from which
// ledger_expect_test.go computes every audit number and list in Go —
// independently of the SQL the audit runs.

// mRec is what the scenario knows of one record; loc is filled in once the
// record is produced (rec's partition and offset).
type mRec struct {
	rec   *kgo.Record
	topic string
	ts    time.Time
}

func (r *mRec) ms() uint64 { return uint64(r.ts.UnixMilli()) }

// key is the record's Kafka location.
func (r *mRec) key() mLoc { return mLoc{r.rec.Topic, r.rec.Partition, r.rec.Offset} }

type mLoc struct {
	topic     string
	partition int32
	offset    int64
}

func (l mLoc) String() string {
	return l.topic + "/" + strconv.Itoa(int(l.partition)) + "@" + strconv.FormatInt(l.offset, 10)
}

type mEvent struct {
	mRec
	id     string // "" when not JSON
	parsed bool
}

type mRejection struct {
	mRec
	eventID string
	reason  string
	src     *mEvent // nil: refused at the ingest gateway
}

// key identifies the rejected event (rejectionKey).
func (j *mRejection) eventKey() mLoc {
	if j.src == nil {
		return j.key()
	}
	return j.src.key()
}

type mPlay struct {
	mRec
	reportID, eventID string
	below             bool
	eventAt           int64 // the event record time it carries (TrackPlay.EventAt; 0: an old record without it)
}

type mDelivery struct {
	mRec
	reportID, eventID, outcome string
	at                         int64
	replayID, replayReason     string
	inDoubt                    bool
	doubtCause                 string
	partner, traceID, message  string
}

type mMalformed struct{ mRec }

// scenario is the records to produce (events first: the rejections refer
// to their locations) and the facts behind them.
type scenario struct {
	events     []*mEvent
	rejections []*mRejection
	plays      []*mPlay
	deliveries []*mDelivery
	malformed  []*mMalformed
	// sandboxExtra is a sandbox target that is not on loopback
	// (AuditOptions.SandboxTargets).
	sandboxExtra string
}

const (
	partnerReal    = "https://api.partner.example"
	partnerSandbox = "http://127.0.0.1:8088/"
	partnerExtra   = "http://sandbox:8088"
)

// newScenario makes n events around now (some older than the window
// start, from): a reproducible function of seed.
func newScenario(t testing.TB, seed uint64, n int, now, from time.Time, topics kafkax.Topics) *scenario {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	s := &scenario{sandboxExtra: partnerExtra}
	msAt := func(t time.Time) time.Time { return t.Truncate(time.Millisecond) }
	rec := func(topic, key string, value []byte, ts time.Time) mRec {
		ts = msAt(ts)
		return mRec{rec: &kgo.Record{Topic: topic, Key: []byte(key), Value: value, Timestamp: ts}, topic: topic, ts: ts}
	}
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	messages := []string{"isrc is invalid", "played_at is in the future", "user_id is unknown"}
	reasons := []string{schemas.ReasonMissingUserID, schemas.ReasonBadCountry, schemas.ReasonMalformedJSON}
	replays := map[string]string{"rp-a": "partner lost a day", "rp-b": "redrive after fix"}

	for i := range n {
		id := fmt.Sprintf("ev%03d", i)
		// Most events in the last 90 minutes; a few before the window.
		ts := now.Add(-time.Duration(rng.IntN(90*60_000)) * time.Millisecond)
		if rng.IntN(12) == 0 {
			ts = from.Add(-time.Duration(1+rng.IntN(60)) * time.Minute)
		}
		user := "u" + strconv.Itoa(rng.IntN(5))
		switch k := rng.IntN(100); {
		case k < 6: // not JSON (or not an object)
			raw := []byte(pick("\xff not json {", `[{"event_id":"x"}]`, ` null`, `{"event_id":`))
			s.events = append(s.events, &mEvent{mRec: rec(topics.Events, id, raw, ts)})
			if rng.IntN(2) == 0 {
				s.rejections = append(s.rejections, &mRejection{eventID: "", reason: schemas.ReasonMalformedJSON, src: s.events[len(s.events)-1]})
			}
			continue
		case k < 14: // rejected (published once or twice)
			ev := &mEvent{mRec: rec(topics.Events, id, eventJSON(t, id, ""), ts), id: id, parsed: true}
			s.events = append(s.events, ev)
			reason := pick(reasons[:2]...)
			for range 1 + rng.IntN(2) {
				s.rejections = append(s.rejections, &mRejection{eventID: id, reason: reason, src: ev})
			}
			continue
		case k < 19: // valid, zero plays; some rejected offset_beyond_mix by an older consumer
			ev := &mEvent{mRec: rec(topics.Events, id, eventJSON(t, id, user), ts), id: id, parsed: true}
			s.events = append(s.events, ev)
			if rng.IntN(2) == 0 {
				s.rejections = append(s.rejections, &mRejection{eventID: id, reason: schemas.ReasonOffsetBeyondMix, src: ev})
			}
			continue
		}
		// Valid with plays; some events published twice, some plays
		// without their event in the ledger.
		// The event's record times: the plays carry one of them (the
		// record the consumer derived them from; an event published twice
		// may yield its plays from the later record), or none (records
		// written before TrackPlay.EventAt existed).
		var evTimes []int64
		switch k := rng.IntN(20); {
		case k == 0: // the event never reached the ledger
			evTimes = append(evTimes, ts.UnixMilli())
		default:
			for range 1 + b2int(k == 1) {
				ets := ts.Add(time.Duration(rng.IntN(500)) * time.Millisecond)
				s.events = append(s.events, &mEvent{mRec: rec(topics.Events, id, eventJSON(t, id, user), ets), id: id, parsed: true})
				evTimes = append(evTimes, ets.UnixMilli())
			}
		}
		oldStyle := rng.IntN(4) == 0
		for pos := range 1 + rng.IntN(3) {
			below := rng.IntN(10) == 0
			pts := ts.Add(time.Second + time.Duration(rng.IntN(2000))*time.Millisecond)
			for range 1 + b2int(rng.IntN(7) == 0) { // re-derived: a second record
				eventAt := evTimes[rng.IntN(len(evTimes))]
				if oldStyle && rng.IntN(3) != 0 {
					eventAt = 0
				}
				reportID, body := playJSONAt(t, id, pos, below, eventAt)
				s.plays = append(s.plays, &mPlay{mRec: rec(topics.Reports, reportID, body, pts), reportID: reportID, eventID: id, below: below, eventAt: eventAt})
			}
			reportID := schemas.ReportID(id, pos)
			at := pts.UnixMilli() + 50 + int64(rng.IntN(5000))
			partner := partnerReal
			switch rng.IntN(10) {
			case 0, 1:
				partner = partnerSandbox
			case 2:
				partner = partnerExtra
			}
			cause := "" // the doubt cause of the next answer (schemas.Doubt*), then cleared
			answer := func(outcome, replayID string, doubt bool, msg string) {
				tid := ""
				if rng.IntN(6) != 0 {
					tid = fmt.Sprintf("trace-%s-%d", reportID[:8], at)
				}
				d := &mDelivery{reportID: reportID, eventID: id, outcome: outcome, at: at, replayID: replayID, replayReason: replays[replayID],
					inDoubt: doubt, doubtCause: cause, partner: partner, traceID: tid, message: msg}
				cause = ""
				d.mRec = rec(topics.Deliveries, reportID, deliveryRecord(t, d), time.UnixMilli(at))
				s.deliveries = append(s.deliveries, d)
				at += 1 + int64(rng.IntN(20_000)) // strictly later: argMax(outcome, at_ms) has one answer
			}
			switch k := rng.IntN(100); {
			case k < 8: // pending, no answer
			case k < 12:
				answer(schemas.OutcomeRetry, "", false, "")
			case k < 15:
				answer(schemas.OutcomeStandby, "", false, "")
			case k < 45:
				answer(schemas.OutcomeDelivered, "", false, "ok")
			case k < 55:
				answer(schemas.OutcomeStandby, "", false, "")
				if rng.IntN(2) == 0 {
					answer(schemas.OutcomeStandby, "", false, "")
				}
				answer(schemas.OutcomeDelivered, "", false, "ok")
			case k < 65:
				answer(schemas.OutcomeRejected, "", false, pick(messages...))
			case k < 68:
				answer(schemas.OutcomeRejected, "", false, pick(messages...))
				answer(schemas.OutcomeDelivered, "rp-b", false, "ok") // redriven
			case k < 74:
				answer(schemas.OutcomeDelivered, "", false, "ok")
				answer(schemas.OutcomeDelivered, "", false, "ok") // a double
			case k < 80:
				cause = schemas.DoubtTimeout
				answer(schemas.OutcomeRetry, "", true, "")       // timed out after sending: one possible copy
				answer(schemas.OutcomeDelivered, "", true, "ok") // in doubt
			case k < 84:
				answer(schemas.OutcomeDelivered, "", true, "ok")
				answer(schemas.OutcomeDelivered, "", false, "ok") // a double, also in doubt
			case k < 90:
				answer(schemas.OutcomeDelivered, "", false, "ok")
				answer(schemas.OutcomeDelivered, "rp-a", false, "ok") // replayed: not a double
			case k < 93:
				answer(schemas.OutcomeDelivered, "rp-a", false, "ok")
				answer(schemas.OutcomeDelivered, "rp-a", false, "ok") // the same replay twice
			case k < 94:
				answer(schemas.OutcomeRetry, "", false, "")
				answer(schemas.OutcomeRejected, "rp-a", false, pick(messages...))
			case k < 95:
				answer(schemas.OutcomeRetry, "", false, "")
				answer(schemas.OutcomeParked, "", false, "internal service error") // parked: pending, listed as parked
				if rng.IntN(2) == 0 {
					answer(schemas.OutcomeParked, "", false, "internal service error") // a slow retry failed again
				}
			case k < 96:
				answer(schemas.OutcomeParked, "", false, "internal service error")
				if rng.IntN(2) == 0 {
					answer(schemas.OutcomeDelivered, "", false, "ok") // a slow retry delivered it
				} else {
					answer(schemas.OutcomeDelivered, "rp-b", false, "ok") // redrive --parked
				}
			default:
				partner = partnerReal
				answer(schemas.OutcomeDelivered, "", false, "ok")
				partner = partnerSandbox
				answer(schemas.OutcomeDelivered, "", false, "ok")
			}
		}
	}
	// Refused at the ingest gateway: never on the events topic; two at the
	// same instant (the lists must still order them one way).
	gw := now.Add(-20 * time.Minute)
	for i := range 4 {
		ts := gw
		if i == 3 {
			ts = from.Add(-time.Minute) // outside the window
		}
		s.rejections = append(s.rejections, &mRejection{eventID: fmt.Sprintf("gw%d", i), reason: schemas.ReasonBadCountry, mRec: mRec{ts: msAt(ts)}})
	}
	for i := range 3 {
		topic := topics.Deliveries
		if i == 2 {
			topic = topics.Reports
		}
		s.malformed = append(s.malformed, &mMalformed{rec(topic, "junk", []byte("not a record "+strconv.Itoa(i)), now.Add(-time.Duration(i+1)*time.Minute))})
	}
	return s
}

// rejectionRecords makes the records of the rejections, once the events
// they refer to have their locations.
func (s *scenario) rejectionRecords(t testing.TB, topics kafkax.Topics) []*kgo.Record {
	var out []*kgo.Record
	for _, j := range s.rejections {
		var raw []byte
		src := schemas.Source{Topic: "ingest", Partition: -1, Offset: -1}
		ts := j.ts
		if j.src != nil {
			raw = j.src.rec.Value
			src = schemas.Source{Topic: j.src.rec.Topic, Partition: j.src.rec.Partition, Offset: j.src.rec.Offset}
			ts = j.src.ts.Add(10 * time.Millisecond)
		} else {
			raw = []byte(`{"event_id":"` + j.eventID + `"}`)
		}
		rej := schemas.NewRejection(raw, j.eventID, []schemas.Violation{{Field: "f", Reason: j.reason, Detail: "d"}}, src, ts.UnixMilli())
		j.mRec = mRec{rec: &kgo.Record{Topic: topics.Rejected, Key: []byte(j.eventID), Value: mustJSON(t, rej), Timestamp: ts}, topic: topics.Rejected, ts: ts}
		out = append(out, j.rec)
	}
	return out
}

// otherRecords are the plays, deliveries and malformed records.
func (s *scenario) otherRecords() []*kgo.Record {
	var out []*kgo.Record
	for _, p := range s.plays {
		out = append(out, p.rec)
	}
	for _, d := range s.deliveries {
		out = append(out, d.rec)
	}
	for _, m := range s.malformed {
		out = append(out, m.rec)
	}
	return out
}

func (s *scenario) eventRecords() []*kgo.Record {
	var out []*kgo.Record
	for _, e := range s.events {
		out = append(out, e.rec)
	}
	return out
}

func deliveryRecord(t testing.TB, d *mDelivery) []byte {
	v := schemas.Delivery{V: schemas.DeliveryVersion, ReportID: d.reportID, EventID: d.eventID, Outcome: d.outcome, Attempt: 1,
		HTTPStatus: 200, Partner: d.partner, Message: d.message, LatencyUS: 1500, TraceID: d.traceID, InDoubt: d.inDoubt,
		DoubtCause: d.doubtCause, ReplayID: d.replayID, ReplayReason: d.replayReason, At: d.at}
	v.HTTPStatus, v.Reason = answerOf(d.outcome)
	if d.outcome == schemas.OutcomeStandby {
		v.ServedBy = "standby"
	}
	return mustJSON(t, v)
}

// answerOf is the HTTP status and retry reason of the model's answers of
// outcome.
func answerOf(outcome string) (status int, reason string) {
	switch outcome {
	case schemas.OutcomeRejected:
		return 400, ""
	case schemas.OutcomeRetry:
		return 503, "http_503"
	case schemas.OutcomeParked:
		return 500, "http_500"
	}
	return 200, ""
}

func b2int(b bool) int {
	if b {
		return 1
	}
	return 0
}
