package reporter

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/reporter/delivery"
	"github.com/playpipe/playpipe/schemas"
)

// hangPartner is a badPartner whose failing reports, once hang is set,
// are held for hang and then answered by no answer at all: the partner
// client's own timeout (context.DeadlineExceeded), the way a post that
// outlasts --api-timeout ends.
type hangPartner struct {
	*badPartner
	hang      atomic.Int64 // time.Duration; 0: the badPartner's answers
	hangPosts atomic.Int64 // posts held to their end
}

func (h *hangPartner) ReportPlayJSON(ctx context.Context, body []byte) (partnerapi.ReportResult, error) {
	d := time.Duration(h.hang.Load())
	if d > 0 && h.failing.Load() {
		var r struct {
			UserID string `json:"userid"`
		}
		_ = json.Unmarshal(body, &r)
		h.mu.Lock()
		bad := h.ids[r.UserID]
		h.mu.Unlock()
		if bad {
			t := time.NewTimer(d) // the partner's hang: real time
			defer t.Stop()
			select {
			case <-ctx.Done():
				return partnerapi.ReportResult{}, ctx.Err()
			case <-t.C:
			}
			h.hangPosts.Add(1)
			return partnerapi.ReportResult{}, fmt.Errorf("post report: %w", context.DeadlineExceeded)
		}
	}
	return h.badPartner.ReportPlayJSON(ctx, body)
}

// TestSlowRetryOutlastingShutdownTimeout: a parked report's slow retry
// whose post takes longer than --shutdown-timeout (a partner holding it
// until the client's --api-timeout). The slow retry is a failed attempt
// like any other: its answer recorded as parked (reason timeout), the
// entry due again later; the reporter never stops, and once the partner
// answers again every parked report is delivered, every other report once. Before the slow retry's deadline covered its post and its
// records, the answer's Delivery record was published with an expired
// context and the reporter stopped ("publish delivery record of a parked
// report: context deadline exceeded").
func TestSlowRetryOutlastingShutdownTimeout(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 2)
	e.group = "reporter-slow-hang"
	e.publish("good", 100, 0, 0)
	bad := e.publishTrack("hang", 4, 777)
	e.publish("good-after", 100, 0, 0)
	partner := &hangPartner{badPartner: e.newBadPartner(bad)}

	cfg := e.config()
	cfg.ParkAfterAttempts, cfg.ParkAfter = 3, 100*time.Millisecond
	cfg.ParkRetries = []time.Duration{300 * time.Millisecond}
	cfg.ShutdownTimeout = time.Second
	stop, ended := e.startRun(cfg, partner)
	e.waitParked(bad, "good", 5, ended, stop)
	// The parked reports' slow retries now hang twice the shutdown timeout.
	partner.hang.Store(int64(2 * time.Second))
	timeouts := func() int {
		n := 0
		for _, d := range e.deliveries() {
			if bad[d.ReportID] && d.Outcome == schemas.OutcomeParked && d.Reason == delivery.ReasonTimeout {
				n++
			}
		}
		return n
	}
	deadline := time.Now().Add(45 * time.Second)
	for timeouts() < 2*len(bad) {
		select {
		case <-ended:
			t.Fatalf("the reporter stopped during hanging slow retries: %v", stop())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d slow retries that timed out on record after 45 s (partner held %d), want %d", timeouts(), partner.hangPosts.Load(), 2*len(bad))
		}
		time.Sleep(100 * time.Millisecond) // polls the deliveries topic
	}
	// Lifted: every parked report delivered; none lost, none twice (the
	// stand-in never delivered a post it held).
	partner.hang.Store(0)
	partner.failing.Store(false)
	e.expectDelivered(bad)
	e.waitLedger(60 * time.Second)
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false)
}

// TestParkWithFullProduceBuffer: parking chains two records (the entry,
// then the parked Delivery record once the entry is acknowledged). franz-go
// runs a produce callback before it frees the record's room in its buffer,
// so a produce from inside one waits forever for room once the buffer is
// full (kgo.MaxBufferedRecords; 1 here, the burst of records at a park in
// production). The report must be parked and the reporter must stop.
func TestParkWithFullProduceBuffer(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 1)
	e.group = "reporter-park-full-buffer"
	e.kgoOpts = []kgo.Opt{kgo.MaxBufferedRecords(1)}
	e.publish("good", 20, 0, 0)
	bad := e.publishTrack("bad", 2, 666)
	partner := e.newBadPartner(bad)
	cfg := e.config()
	cfg.ParkAfterAttempts, cfg.ParkAfter = 3, 50*time.Millisecond
	cfg.ParkRetries = []time.Duration{time.Hour}
	stop, ended := e.startRun(cfg, partner) // stop fails the test unless Run returns within 30 s
	e.waitParked(bad, "good", 2, ended, stop)
	if err := stop(); err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestRedriveRequestServedByOwner: `playpipe redrive --parked` asks the
// owner of a parked report to post it (a schemas.RedriveRequest in
// <prefix>.parked) instead of posting it itself. The owner's slow lane
// posts each requested report once, at once (its slow schedule is an hour
// away), the Delivery record carrying the redrive's replay id and reason,
// and removes the request; a request for a report that is not parked
// (delivered already) is removed without a post; the reports not
// requested stay parked.
func TestRedriveRequestServedByOwner(t *testing.T) {
	if testing.Short() {
		t.Skip("end to end")
	}
	e := newE2E(t, 2)
	e.group = "reporter-redrive-request"
	good := e.publish("good", 50, 0, 0)
	bad := e.publishTrack("bad", 4, 666)
	partner := e.newBadPartner(bad)
	cfg := e.config()
	cfg.ParkAfterAttempts, cfg.ParkAfter = 3, 50*time.Millisecond
	cfg.ParkRetries = []time.Duration{time.Hour}
	stop, ended := e.startRun(cfg, partner)
	e.waitParked(bad, "good", 5, ended, stop)
	e.waitLedger(60 * time.Second)
	partner.failing.Store(false)

	// The source partitions of the parked reports, from their entries.
	topics := e.kafka.Config.Topics()
	src := map[string]int32{}
	for _, r := range e.kafka.ReadAll(t, topics.Parked) {
		var p schemas.Parked
		if len(r.Value) > 0 && json.Unmarshal(r.Value, &p) == nil && p.ReportID != "" {
			src[p.ReportID] = p.Source.Partition
		}
	}
	var asked []string
	for id := range bad {
		if len(asked) < 2 {
			asked = append(asked, id)
		}
	}
	var goodTP schemas.TrackPlayHead
	if err := schemas.DecodeTrackPlayHead(good[0].Value, &goodTP); err != nil {
		t.Fatal(err)
	}
	reqs := map[string]int32{asked[0]: src[asked[0]], asked[1]: src[asked[1]], goodTP.ReportID: 0}
	var recs []*kgo.Record
	for id, p := range reqs {
		v, _ := json.Marshal(schemas.RedriveRequest{V: 1, ReportID: id, Partition: p, ReplayID: "rp-test", Reason: "partner fixed it", At: time.Now().UnixMilli()})
		recs = append(recs, &kgo.Record{Topic: topics.Parked, Partition: p % 2, Key: []byte(schemas.RedriveKeyPrefix + id), Value: v})
	}
	cl := e.kafka.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.delivered[asked[0]], e.delivered[asked[1]] = true, true
	e.mu.Unlock()
	e.waitLedger(30 * time.Second)
	// Every request removed (its last record a tombstone).
	waitFor(t, 30*time.Second, func() bool {
		last := map[string]bool{}
		for _, r := range e.kafka.ReadAll(t, topics.Parked) {
			if _, ok := strings.CutPrefix(string(r.Key), schemas.RedriveKeyPrefix); ok {
				last[string(r.Key)] = len(r.Value) > 0
			}
		}
		for id := range reqs {
			if last[schemas.RedriveKeyPrefix+id] {
				return false
			}
		}
		return true
	})
	select {
	case <-ended:
		t.Fatalf("the reporter stopped: %v", stop())
	default:
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	e.checkExactlyOnce(false) // the good ones and the two asked for, once each
	for _, d := range e.deliveries() {
		switch {
		case (d.ReportID == asked[0] || d.ReportID == asked[1]) && d.Outcome == schemas.OutcomeDelivered:
			if d.ReplayID != "rp-test" || d.ReplayReason != "partner fixed it" {
				t.Errorf("the delivered record of a redriven report: %+v, want replay id rp-test and its reason", d)
			}
		case d.ReplayID != "" && d.ReportID == goodTP.ReportID:
			t.Errorf("a record of the redrive for a report that was not parked: %+v", d)
		}
	}
	if n := partner.badPosts.Load(); n == 0 {
		t.Error("no post of the parked reports while the fault was on")
	}
}

// TestRevocationWaitsForSlowRetry: the writes of a partition's parked
// state are fenced by its ownership. A revocation cancels the partition's
// slow posts, no slow retry of it starts after, and it completes only once
// the slow retry under way has ended — past its deadline too — so no write
// of the old owner lands after the next owner's.
func TestRevocationWaitsForSlowRetry(t *testing.T) {
	rn, ps := bareRun(t, 1, 0)
	rn.log = testLogger(t)
	ctx, ok := rn.slowStart(ps)
	if !ok {
		t.Fatal("a slow retry of an owned partition did not start")
	}
	req := revokeReq{parts: map[string][]int32{"p.reports": {0}}, reply: make(chan []commitEntry, 1)}
	rn.startRevocation(req)
	if ctx.Err() == nil {
		t.Error("the revocation did not cancel the partition's slow posts")
	}
	if _, ok := rn.slowStart(ps); ok {
		t.Error("a slow retry started on a revoking partition")
	}
	rn.checkRevocations(rn.cfg.Now().Add(10 * rn.cfg.ShutdownTimeout)) // past the deadline
	select {
	case <-req.reply:
		t.Fatal("the revocation completed while a slow retry of the partition was under way")
	default:
	}
	if rn.part(ps.key) != ps {
		t.Fatal("the partition was dropped while a slow retry of it was under way")
	}
	rn.slowEnd(ps)
	rn.checkRevocations(rn.cfg.Now())
	select {
	case <-req.reply:
	default:
		t.Fatal("the revocation did not complete once the slow retry ended")
	}
	if rn.part(ps.key) != nil {
		t.Error("the partition is still this run's after its revocation")
	}
}
