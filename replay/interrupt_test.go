package replay

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/schemas"
)

// TestInterruptedRunResumes: a run interrupted (the operator's SIGTERM)
// after its first post counts the reports it never reached as untried, not
// missing, and records that it stopped with every post on record; the
// re-run of its id sends those reports without labelling them crash (no
// earlier post of theirs can be at the partner unrecorded). Before, they
// were counted missing and every report of the re-run said crash.
func TestInterruptedRunResumes(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := true
	g := newDeliverRig(t, func(_ int, w http.ResponseWriter, _ *http.Request) {
		if first {
			first = false
			cancel() // interrupted during its first post, answered all the same
		}
		fmt.Fprint(w, `{"error":false,"message":"success"}`)
	}, nil)
	g.r.cfg.Concurrency, g.r.cfg.Out = 1, io.Discard
	topics := g.k.Config.Topics()
	const n = 20
	var recs []*kgo.Record
	var items []item
	for i := range n {
		id := fmt.Sprintf("%032x", i+1)
		v, _ := json.Marshal(schemas.TrackPlay{V: schemas.TrackPlayVersion, ReportID: id, EventID: fmt.Sprintf("ev-%d", i), MixID: 1,
			Report: schemas.PlayReport{TrackID: 1, PlayLength: 65, UserID: id, Country: "DE"}})
		recs = append(recs, &kgo.Record{Topic: topics.Reports, Partition: 0, Key: []byte(id), Value: v})
	}
	cl := g.k.Client(t, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for i, r := range recs {
		items = append(items, item{reportID: string(r.Key), eventID: fmt.Sprintf("ev-%d", i), partition: 0, offset: r.Offset, timeMS: r.Timestamp.UnixMilli()})
	}
	adm := kadm.NewClient(cl)
	group := "playpipe-replay." + g.r.cfg.ReplayID
	opts, err := g.k.Config.ClientOpts()
	if err != nil {
		t.Fatal(err)
	}
	var res Result
	if err := g.r.send(ctx, opts, adm, group, topics.Reports, items, prior{}, &res); err == nil {
		t.Fatal("the interrupted run returned no error")
	}
	if res.Missing != 0 || res.Untried == 0 || res.Delivered+res.Untried+res.Unfinished > n {
		t.Errorf("interrupted run: %+v, want none missing, the reports it never reached untried", res)
	}
	pr, err := runStart(context.Background(), adm, group, topics.Reports)
	if err != nil || !pr.found || pr.crashed {
		t.Fatalf("after a graceful interrupt: %+v, %v; want found, not crashed", pr, err)
	}
	// The re-run of the id: what is left, none of it labelled crash.
	done, err := alreadyDone(context.Background(), g.r.w, opts, adm, topics.Deliveries, g.r.cfg.ReplayID, pr.startMS)
	if err != nil {
		t.Fatal(err)
	}
	var left []item
	for _, it := range items {
		if !done[it.reportID] {
			left = append(left, it)
		}
	}
	re := &runner{cfg: g.r.cfg, w: g.r.w, api: g.r.api, log: g.r.log, cl: g.r.cl, topic: g.r.topic, kind: KindReplay, inDoubt: pr.crashed}
	var res2 Result
	if err := re.send(context.Background(), opts, adm, group, topics.Reports, left, pr, &res2); err != nil {
		t.Fatalf("re-run: %v (%+v)", err, res2)
	}
	if res2.Delivered != len(left) {
		t.Errorf("re-run delivered %d, want %d", res2.Delivered, len(left))
	}
	for _, d := range g.records(t) {
		if d.DoubtCause == schemas.DoubtCrash || (d.InDoubt && d.DoubtCause == "") {
			t.Errorf("a record labelled as after a crash, though every run stopped gracefully: %+v", d)
		}
	}
}
