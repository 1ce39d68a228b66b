//go:build linux

package edge

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/replay"
	"github.com/playpipe/playpipe/schemas"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// The edge's limit on request bodies while the fault lasts: every normal
// report (~300 bytes) passes, the oversized one (~6 KiB) gets nginx's own
// 413 page. Lifting the fault raises it to 1m.
const (
	parkEdgeLimit  = "client_max_body_size 4k;"
	parkEdgeLifted = "client_max_body_size 1m;"
	parkBigDetail  = 6000 // bytes of the oversized report's sourcedetail
)

// TestEdge413Parked (parking, the edge's case): the sandbox
// behind nginx whose client_max_body_size takes every normal report but
// not one oversized report; `playpipe report` (a small park budget, a slow
// lane of 1 h) and `playpipe sink` run as processes of the built binary,
// the ledger on a local ClickHouse. Normal reports are published to
// <prefix>.reports before, around and after the oversized one, until the
// reporter parks it. Checks: every normal report at the partner exactly
// once; the oversized one never, parked with a Delivery record carrying the
// edge's 413 (retry reason http_413, doubt cause edge_answer); `playpipe
// audit --list parked` lists it with that answer, the audit counts it
// pending and parked, not delivered, and exits 3. Then the fault is lifted
// (nginx's limit raised, reloaded) and `playpipe redrive --parked` delivers
// it: at the partner exactly once, the audit counts it delivered (not
// twice), nothing parked or pending, the <prefix>.parked entry tombstoned.
func TestEdge413Parked(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	nginxBinary(t)
	start := time.Now()
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)

	sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Seed = 3; c.Pages, c.ListsPerPage, c.MixesPerList = 1, 1, 2 })
	cs := makeCerts(t, dir)
	up, err := url.Parse(sb.URL)
	if err != nil {
		t.Fatal(err)
	}
	conf := edgeConf{http2: true, server: parkEdgeLimit}
	n := startNginx(t, up.Host, cs, dir, conf)
	k := testenv.StartKafka(t, 3)
	ch := testenv.StartClickHouse(t)
	topics := k.Config.Topics()
	apiURL := "https://" + n.addr

	ps := testenv.NewProcs(t, bin, dir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
		"SSL_CERT_FILE="+cs.certFile, // the test's CA (after the leaf in the chain file)
	))
	kafkaArgs := []string{"--brokers", strings.Join(k.Addrs(), ","), "--partitions", "3"}
	chArgs := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	sinkAdmin, reportAdmin := testenv.FreeAddr(t), testenv.FreeAddr(t)
	sink := ps.Start("sink", append(append(append([]string{"sink", "--admin-addr", sinkAdmin}, kafkaArgs...), chArgs...),
		"--instance-id", "edgepark-sink", "--batch-rows", "2000", "--linger", "200ms", "--retry-max", "500ms")...)
	testenv.WaitReady(t, sink, sinkAdmin, 60*time.Second)
	rep := ps.Start("report", append(append([]string{"report", "--admin-addr", reportAdmin}, kafkaArgs...),
		"--api-url", apiURL, "--instance-id", "edgepark-report", "--concurrency", "8",
		"--backoff-initial", "50ms", "--backoff-max", "300ms", "--standby-probe-interval", "100ms",
		"--park-after-attempts", "3", "--park-after", "2s", "--park-retries", "1h", "--warn-after-attempts", "2")...)
	testenv.WaitReady(t, rep, reportAdmin, 60*time.Second)
	t.Logf("setup: binary, sandbox, nginx %s (%s), broker, ClickHouse, sink and reporter ready in %s", n.addr, parkEdgeLimit, time.Since(start).Round(time.Millisecond))

	alive := func() {
		t.Helper()
		for _, p := range []*testenv.Proc{sink, rep} {
			if !p.Running() {
				t.Fatalf("%s exited on its own: %v (log %s)", p.Name, p.Err, p.Log)
			}
		}
	}
	waitFor := func(what string, d time.Duration, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for !cond() {
			alive()
			if time.Now().After(deadline) {
				t.Fatalf("waiting for %s: not within %s (sandbox %+v)", what, d, sb.Counts())
			}
			time.Sleep(100 * time.Millisecond)
		}
	}

	// Publish: 100 normal reports, the oversized one, then normal reports
	// (20 ms apart, so the partner keeps taking others while the big one
	// fails: the park budget counts only then) until it is parked, then 100
	// more.
	cl := k.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	now := time.Now()
	normal := map[string]bool{}
	seq := 0
	publish := func(tp schemas.TrackPlay) {
		t.Helper()
		v, err := json.Marshal(tp)
		if err != nil {
			t.Fatal(err)
		}
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topics.Reports, Key: []byte(tp.ReportID), Value: v}).FirstErr(); err != nil {
			t.Fatalf("publish %s: %v", tp.ReportID, err)
		}
	}
	publishNormal := func() {
		t.Helper()
		tp := parkPlay(fmt.Sprintf("edgepark-%d", seq), now, "Test mix")
		seq++
		normal[tp.ReportID] = true
		publish(tp)
		time.Sleep(20 * time.Millisecond)
	}
	for range 100 {
		publishNormal()
	}
	big := parkPlay("edgepark-oversized", now, strings.Repeat("d", parkBigDetail))
	if body, _ := json.Marshal(big.Report); len(body) <= 4096 {
		t.Fatalf("the oversized report's body has %d bytes, not over the edge's 4k", len(body))
	}
	publish(big)
	parkedAt := time.Time{}
	for deadline := time.Now().Add(60 * time.Second); parkedAt.IsZero(); {
		publishNormal()
		alive()
		if seq%10 == 0 {
			if v, err := testenv.ScrapeSum(reportAdmin, "playpipe_reporter_parks"); err == nil && v >= 1 {
				parkedAt = time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the oversized report was not parked within 60 s (%d normal reports published; sandbox %+v)", seq, sb.Counts())
		}
	}
	for range 100 {
		publishNormal()
	}
	t.Logf("%s: published %d normal reports and the oversized one (%s); parked after %d normal reports", since(start), len(normal), big.ReportID, len(normal)-100)

	// Every normal report at the partner once, the oversized one never.
	waitFor("every normal report at the partner", 90*time.Second, func() bool {
		return countAt(sb, normal, "") >= len(normal)
	})
	checkPartner(t, sb, normal, big.ReportID, 0)

	// The Delivery record with outcome parked carries the edge's 413.
	var parked []schemas.Delivery
	waitFor("the parked Delivery record", 30*time.Second, func() bool {
		parked = deliveriesOf(t, k, big.ReportID, schemas.OutcomeParked)
		return len(parked) > 0
	})
	if len(parked) != 1 {
		t.Errorf("%d Delivery records with outcome parked for %s, want 1 (the slow lane waits 1 h): %+v", len(parked), big.ReportID, parked)
	}
	p0 := parked[0]
	if p0.HTTPStatus != http.StatusRequestEntityTooLarge || p0.Reason != "http_413" || p0.DoubtCause != schemas.DoubtEdgeAnswer || p0.Attempt < 3 {
		t.Errorf("the parked record: status %d, reason %q, doubt cause %q, attempt %d; want 413, http_413, %s, ≥ 3", p0.HTTPStatus, p0.Reason, p0.DoubtCause, p0.Attempt, schemas.DoubtEdgeAnswer)
	}
	if got := n.countStatus("413"); got < 3 {
		t.Errorf("the edge's access log has %d posts answered 413, want ≥ 3 (the park budget)", got)
	}
	t.Logf("%s: parked record: status %d, reason %s, doubt cause %s, attempt %d, message %q", since(start), p0.HTTPStatus, p0.Reason, p0.DoubtCause, p0.Attempt, p0.Message)

	// The audit: parked, pending, not delivered; --list parked names it
	// with its last answer; exit 3.
	auditArgs := append(append([]string{"audit"}, chArgs...), "--from", "-2h", "--to", "+1h")
	var a analytics.Audit
	var code int
	waitFor("the audit to see the normal reports delivered and the parked one", 60*time.Second, func() bool {
		a, code = runAuditJSON(t, bin, auditArgs)
		return a.Delivered >= uint64(len(normal)) && a.Parked >= 1
	})
	if a.Delivered != uint64(len(normal)) || a.Parked != 1 || a.Pending != 1 || a.PlaysReportable != uint64(len(normal)+1) || a.DeliveredTwice != 0 {
		t.Errorf("audit while parked: delivered %d (want %d), parked %d (want 1), pending %d (want 1), reportable %d (want %d), delivered twice %d (want 0)",
			a.Delivered, len(normal), a.Parked, a.Pending, a.PlaysReportable, len(normal)+1, a.DeliveredTwice)
	}
	if code != 3 {
		t.Errorf("audit while a play is parked exited %d, want 3 (docs/audit.md: parked fails the audit)", code)
	}
	rows, code := runAuditList(t, bin, append(append([]string{}, auditArgs...), "--list", "parked"))
	if len(rows) != 1 || rows[0].ReportID != big.ReportID || !strings.HasPrefix(rows[0].Detail, "parked (HTTP 413 http_413") || rows[0].Delivered != 0 {
		t.Errorf("audit --list parked: %+v; want one row, %s, detail \"parked (HTTP 413 http_413 …\", not delivered", rows, big.ReportID)
	} else {
		t.Logf("%s: audit --list parked (exit %d): %s %q", since(start), code, rows[0].ReportID, rows[0].Detail)
	}
	if del, _ := runAuditList(t, bin, append(append([]string{}, auditArgs...), "--list", "delivered")); hasReport(del, big.ReportID) {
		t.Errorf("audit --list delivered names the parked report %s", big.ReportID)
	}

	// Lift the fault: raise the edge's limit, reload, wait until the new
	// workers answer a large post without 413.
	conf.server = parkEdgeLifted
	if err := os.WriteFile(n.conf, []byte(n.config(up.Host, cs, conf)), 0o600); err != nil {
		t.Fatal(err)
	}
	n.reload()
	waitFor("the reloaded edge to take a large body", 20*time.Second, func() bool { return edgeTakesLarge(n, cs) })
	t.Logf("%s: edge reloaded with %s", since(start), parkEdgeLifted)
	// Nothing delivers it meanwhile: the slow lane waits 1 h.
	time.Sleep(2 * time.Second)
	checkPartner(t, sb, normal, big.ReportID, 0)

	// playpipe redrive --parked delivers it.
	rd, rdCode, rdOut := runRedrive(t, bin, append(append(append([]string{"redrive"}, kafkaArgs...), chArgs...),
		"--api-url", apiURL, "--parked", "--track", "1001", "--reason", "edge limit raised", "--json", "--progress", "50ms"), ps.Env)
	t.Logf("%s: redrive --parked exited %d: %+v", since(start), rdCode, rd)
	if rdCode != 0 || rd.Selected != 1 || rd.Delivered != 1 || rd.Unfinished != 0 {
		t.Errorf("redrive --parked: exit %d, %+v; want exit 0, 1 selected, 1 delivered\n%s", rdCode, rd, rdOut)
	}
	waitFor("the oversized report at the partner", 30*time.Second, func() bool { return countAt(sb, nil, big.ReportID) >= 1 })
	// The reporter's slow lane posted it for the redrive (one poster) and
	// reads the topic every 5 s: wait past another round, then count again.
	time.Sleep(6 * time.Second)
	checkPartner(t, sb, normal, big.ReportID, 1)

	waitFor("the audit to count the redriven report delivered", 60*time.Second, func() bool {
		a, code = runAuditJSON(t, bin, auditArgs)
		return a.Delivered >= uint64(len(normal)+1)
	})
	if a.Delivered != uint64(len(normal)+1) || a.Parked != 0 || a.Pending != 0 || a.DeliveredTwice != 0 {
		t.Errorf("audit after the redrive: delivered %d (want %d), parked %d, pending %d, delivered twice %d (want 0 each)",
			a.Delivered, len(normal)+1, a.Parked, a.Pending, a.DeliveredTwice)
	}
	// The oversized report's posts were answered by the edge (in doubt,
	// edge_answer): its delivery stays labelled possibly twice, the one
	// thing the audit may still flag.
	if a.PossiblyTwice > 1 {
		t.Errorf("audit after the redrive: %d plays possibly delivered twice, want at most the redriven one", a.PossiblyTwice)
	}
	t.Logf("%s: audit after the redrive (exit %d): delivered %d, parked %d, pending %d, possibly twice %d, possible extra copies %d, doubtful posts %v, replays %+v, problems %q",
		since(start), code, a.Delivered, a.Parked, a.Pending, a.PossiblyTwice, a.PossibleExtraCopies, a.DoubtfulPostsByCause, a.Replays, a.Problems())
	if rows, _ := runAuditList(t, bin, append(append([]string{}, auditArgs...), "--list", "parked")); len(rows) != 0 {
		t.Errorf("audit --list parked after the redrive: %+v, want none", rows)
	}
	if del := deliveriesOf(t, k, big.ReportID, schemas.OutcomeDelivered); len(del) != 1 || del[0].ReplayID == "" || del[0].ReplayReason != "edge limit raised" {
		t.Errorf("delivered records of %s: %+v; want one, the redrive's (replay id, reason \"edge limit raised\")", big.ReportID, del)
	} else {
		t.Logf("the redrive's delivered record: status %d, attempt %d, in_doubt %v, doubt cause %q, replay %s", del[0].HTTPStatus, del[0].Attempt, del[0].InDoubt, del[0].DoubtCause, del[0].ReplayID)
	}
	// The parked entry is tombstoned: the latest record of its key in
	// <prefix>.parked has no value.
	var last *kgo.Record
	for _, r := range k.ReadAll(t, topics.Parked) {
		if string(r.Key) == big.ReportID {
			last = r
		}
	}
	if last == nil || last.Value != nil {
		t.Errorf("<prefix>.parked: the latest record of %s is %v, want a tombstone", big.ReportID, last)
	}

	rep.Stop(t, 30*time.Second)
	sink.Stop(t, 30*time.Second)
	t.Logf("%s: done", since(start))
}

// parkPlay is a valid play of event (position 0) with the given
// sourcedetail, recorded an hour before now.
func parkPlay(event string, now time.Time, detail string) schemas.TrackPlay {
	id := schemas.ReportID(event, 0)
	return schemas.TrackPlay{
		V: schemas.TrackPlayVersion, ReportID: id, EventID: event, MixID: 1, OverlapMS: 65_000, DerivedAt: now.UnixMilli(),
		Report: schemas.PlayReport{
			TrackID: 1001, PlayedAt: now.Add(-time.Hour).UnixMilli(), PlayLength: 65, SourceStream: "mix",
			SourceDetail: detail, OS: "android 14", Device: "phone", Country: "DE", Vendor: 7, UserID: id,
		},
	}
}

// countAt counts the partner's accepted reports whose userid (the report
// id) is in ids, or equals id when ids is nil.
func countAt(sb *testenv.Sandbox, ids map[string]bool, id string) int {
	n := 0
	for _, e := range sb.Ledger().Accepted {
		if u := e.Report.UserID; u != nil && (ids[*u] || (ids == nil && *u == id)) {
			n++
		}
	}
	return n
}

// checkPartner checks that the partner accepted every normal report
// exactly once, the big one wantBig times, and nothing else.
func checkPartner(t *testing.T, sb *testenv.Sandbox, normal map[string]bool, big string, wantBig int) {
	t.Helper()
	led := sb.Ledger()
	if led.Dropped != 0 {
		t.Fatalf("the sandbox dropped %d ledger entries", led.Dropped)
	}
	got := map[string]int{}
	for _, e := range led.Accepted {
		if e.Report.UserID == nil {
			t.Errorf("the partner accepted a report without userid: %s", tail(e.Raw, 200))
			continue
		}
		got[*e.Report.UserID]++
	}
	missing, twice := 0, 0
	for id := range normal {
		switch got[id] {
		case 0:
			missing++
		case 1:
		default:
			twice++
		}
	}
	if missing+twice > 0 {
		t.Errorf("the partner holds the %d normal reports with %d missing and %d more than once", len(normal), missing, twice)
	}
	if got[big] != wantBig {
		t.Errorf("the partner holds the oversized report %d times, want %d", got[big], wantBig)
	}
	for id, c := range got {
		if !normal[id] && id != big {
			t.Errorf("the partner holds an unexpected report %s (%d times)", id, c)
		}
	}
}

// deliveriesOf reads <prefix>.deliveries and returns the Delivery records
// of reportID with the given outcome (lease markers skipped).
func deliveriesOf(t *testing.T, k *testenv.Kafka, reportID, outcome string) []schemas.Delivery {
	t.Helper()
	var out []schemas.Delivery
records:
	for _, r := range k.ReadAll(t, k.Config.Topics().Deliveries) {
		for _, h := range r.Headers {
			if h.Key == "playpipe-lease" {
				continue records
			}
		}
		var d schemas.Delivery
		if err := json.Unmarshal(r.Value, &d); err != nil {
			t.Fatalf("a Delivery record is not JSON: %v: %s", err, tail(string(r.Value), 200))
		}
		if d.ReportID == reportID && d.Outcome == outcome {
			out = append(out, d)
		}
	}
	return out
}

// hasReport reports whether rows name id.
func hasReport(rows []analytics.ListRow, id string) bool {
	for _, r := range rows {
		if r.ReportID == id {
			return true
		}
	}
	return false
}

// edgeTakesLarge posts a body of 2 × parkBigDetail bytes to the edge and
// reports whether it got past the edge's size limit (any answer but 413).
func edgeTakesLarge(n *nginx, cs certs) bool {
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cs.pool}}, Timeout: 5 * time.Second}
	defer c.CloseIdleConnections()
	resp, err := c.Post("https://"+n.addr+"/edgepark-probe", "application/json", strings.NewReader(strings.Repeat("x", 2*parkBigDetail)))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode != http.StatusRequestEntityTooLarge
}

// countStatus counts the POST lines of the edge's access log with status.
func (n *nginx) countStatus(status string) int {
	c := 0
	for _, l := range n.accessLog() {
		if f := strings.Fields(l); len(f) == 6 && f[1] == "POST" && f[2] == status {
			c++
		}
	}
	return c
}

func since(t time.Time) string { return fmt.Sprintf("%6s", time.Since(t).Round(100*time.Millisecond)) }

// runCmd runs the binary with args to completion (60 s at most) and returns
// its exit code, stdout and stderr.
func runCmd(t *testing.T, bin string, env []string, args []string) (int, []byte, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = &stdout, &stderr, env
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.Bytes(), stderr.Bytes()
	case errors.As(err, &ee) && ee.ExitCode() >= 0:
		return ee.ExitCode(), stdout.Bytes(), stderr.Bytes()
	default:
		t.Fatalf("playpipe %s: %v\n%s", args[0], err, stderr.String())
		return -1, nil, nil
	}
}

// runAuditJSON runs `playpipe audit --format json`; exit 0 or 3.
func runAuditJSON(t *testing.T, bin string, args []string) (analytics.Audit, int) {
	t.Helper()
	code, out, errOut := runCmd(t, bin, testenv.ChildEnv(), append(append([]string{}, args...), "--format", "json"))
	if code != 0 && code != 3 {
		t.Fatalf("playpipe audit exited %d\n%s", code, errOut)
	}
	var a analytics.Audit
	if err := json.Unmarshal(out, &a); err != nil {
		t.Fatalf("playpipe audit --format json: %v\n%s\n%s", err, out, errOut)
	}
	return a, code
}

// runAuditList runs `playpipe audit --list … --format json`.
func runAuditList(t *testing.T, bin string, args []string) ([]analytics.ListRow, int) {
	t.Helper()
	code, out, errOut := runCmd(t, bin, testenv.ChildEnv(), append(append([]string{}, args...), "--format", "json"))
	if code != 0 && code != 3 {
		t.Fatalf("playpipe audit --list exited %d\n%s", code, errOut)
	}
	var rows []analytics.ListRow
	if err := json.Unmarshal(out, &rows); err != nil {
		t.Fatalf("playpipe audit --list --format json: %v\n%s\n%s", err, out, errOut)
	}
	return rows, code
}

// runRedrive runs `playpipe redrive … --json` and reads its result: stdout
// must be that one JSON object alone (progress lines go to stderr), so a
// script can read it whole.
func runRedrive(t *testing.T, bin string, args, env []string) (replay.Result, int, string) {
	t.Helper()
	code, out, errOut := runCmd(t, bin, env, args)
	var r replay.Result
	if err := json.Unmarshal(out, &r); err != nil {
		t.Errorf("playpipe redrive --json (exit %d): stdout is not one JSON object: %v\n%s\n%s", code, err, out, errOut)
	}
	return r, code, tail(string(out)+string(errOut), 3000)
}
