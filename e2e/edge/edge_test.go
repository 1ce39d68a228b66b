//go:build unix

package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/consumer"
	"github.com/playpipe/playpipe/demo"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/reporter"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// variant is one run of the pipeline behind the edge: its nginx
// configuration, and what happens to the edge while events flow.
type variant struct {
	name string
	conf edgeConf
	// events published at rate per second (the run lasts events/rate).
	events int
	rate   float64
	// during runs while the events are published (the edge's reload and
	// restart); nil for none.
	during func(t *testing.T, n *nginx, runFor time.Duration)
	// wantForeign: the edge answers its own error pages for a share of
	// posts, so some attempts must be labelled edge_answer.
	wantForeign bool
	// logged must hold for some (some) or every (all) POST line of the
	// edge's access log ("proto method status content-encoding
	// transfer-encoding request-number-on-connection"): proof that the run
	// exercised what the variant says.
	some, all func(f []string) bool
}

// TestEdge runs the whole pipeline (the embedded broker, the consumer, the
// reporter, the sink and a real ClickHouse, wired by demo)
// against the sandbox behind Debian's nginx as the partner's edge: TLS with
// the test's own CA, one run per variant. Each run checks, play by play,
// that every expected play reached the partner, that the partner's
// duplicates are no more than the plays labelled in doubt, and that the
// audit's bound on extra copies is no less than the partner's duplicates.
func TestEdge(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end")
	}
	nginxBinary(t)
	variants := []variant{
		{name: "http2", conf: edgeConf{http2: true}, events: 300, rate: 600, all: proto("HTTP/2.0")},
		{name: "http1.1", conf: edgeConf{}, events: 300, rate: 600, all: proto("HTTP/1.1")},
		{name: "keepalive 7 requests 300ms", conf: edgeConf{server: "keepalive_requests 7; keepalive_timeout 300ms;"}, events: 300, rate: 200,
			all: func(f []string) bool { n, err := strconv.Atoi(f[5]); return err == nil && n <= 7 }, some: func(f []string) bool { return f[5] == "7" }},
		{name: "http2 keepalive 7 requests 300ms", conf: edgeConf{http2: true, server: "keepalive_requests 7; keepalive_timeout 300ms;"}, events: 300, rate: 200,
			all: func(f []string) bool { n, err := strconv.Atoi(f[5]); return err == nil && n <= 7 && f[0] == "HTTP/2.0" }, some: func(f []string) bool { return f[5] == "7" }},
		{name: "gzip", conf: edgeConf{http2: true, server: "gzip on; gzip_min_length 0; gzip_proxied any; gzip_types application/json text/plain;"}, events: 300, rate: 600,
			some: func(f []string) bool { return f[3] == "gzip" }},
		{name: "unbuffered chunked", conf: edgeConf{locExt: "proxy_buffering off; sub_filter_types application/json; sub_filter 'success' 'success'; sub_filter_once on;"}, events: 300, rate: 600,
			all: func(f []string) bool { return f[0] == "HTTP/1.1" && f[4] == "chunked" }},
		{name: "9000-byte header", conf: edgeConf{server: `set $h3k "` + bigHeader(3000) + `"; add_header X-Edge-Trace "$h3k$h3k$h3k" always;`}, events: 300, rate: 600, all: proto("HTTP/1.1")},
		{name: "edge 413 and 502 pages", wantForeign: true, conf: edgeConf{http2: true,
			httpExtra: `split_clients "${request_id}" $edge_fault { 7% "413"; 7% "502"; * ""; }`,
			locExt:    `set $post_fault ""; if ($request_method = POST) { set $post_fault $edge_fault; } if ($post_fault = "413") { return 413; } if ($post_fault = "502") { return 502; }`},
			events: 300, rate: 600, some: func(f []string) bool { return f[2] == "413" || f[2] == "502" }},
		{name: "reload and restart", conf: edgeConf{http2: true}, events: 300, rate: 100, during: func(t *testing.T, n *nginx, runFor time.Duration) {
			time.Sleep(runFor / 4)
			t.Log("edge reloaded (SIGHUP)")
			n.reload()
			time.Sleep(runFor / 4)
			t.Log("edge restarted (SIGTERM, start)")
			n.restart()
		}},
	}
	for _, v := range variants {
		t.Run(strings.ReplaceAll(v.name, " ", "_"), func(t *testing.T) {
			sb := testenv.StartSandbox(t, func(c *sandbox.Config) { c.Seed = 3; c.Pages, c.ListsPerPage, c.MixesPerList = 1, 2, 4 })
			dir := t.TempDir()
			cs := makeCerts(t, dir)
			up, err := url.Parse(sb.URL)
			if err != nil {
				t.Fatal(err)
			}
			n := startNginx(t, up.Host, cs, dir, v.conf)
			r := runPipeline(t, pipelineRun{
				sb: sb, apiURL: "https://" + n.addr, rootCAs: cs.pool, requestTimeout: 3 * time.Second,
				events: v.events, rate: v.rate,
				during: func(runFor time.Duration) {
					if v.during != nil {
						v.during(t, n, runFor)
					}
				},
			})
			t.Logf("%s: %d plays delivered, partner duplicates %d, plays labelled in doubt %d, audit possible extra copies %d (%d plays), doubtful posts by cause %v",
				v.name, r.plays, r.duplicates, r.inDoubtPlays, r.audit.PossibleExtraCopies, r.audit.PlaysWithExtraCopies, r.audit.DoubtfulPostsByCause)
			checkLog(t, n, v)
			if v.name == "9000-byte header" {
				checkBigHeader(t, n, cs)
			}
			if v.wantForeign && !r.hasCause("edge_answer") {
				t.Errorf("the edge's own pages were answered, but no post is labelled edge_answer: %v", r.audit.DoubtfulPostsByCause)
			}
		})
	}
}

func proto(p string) func(f []string) bool { return func(f []string) bool { return f[0] == p } }

// checkLog checks the variant's conditions on the POST lines of the edge's
// access log.
func checkLog(t *testing.T, n *nginx, v variant) {
	t.Helper()
	posts, some := 0, false
	for _, l := range n.accessLog() {
		f := strings.Fields(l)
		if len(f) != 6 || f[1] != "POST" {
			continue
		}
		posts++
		if v.all != nil && !v.all(f) {
			t.Errorf("edge access log: %q breaks the variant's condition", l)
			return
		}
		some = some || v.some == nil || v.some(f)
	}
	if posts == 0 || !some {
		t.Errorf("edge access log: %d posts, none shows what the variant exercises", posts)
	}
}

// checkBigHeader checks that the edge really adds the 9 000-byte header.
func checkBigHeader(t *testing.T, n *nginx, cs certs) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: cs.pool}}, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + n.addr + "/partners/catalog")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := len(resp.Header.Get("X-Edge-Trace")); got != 9000 {
		t.Errorf("the edge's X-Edge-Trace header has %d bytes, want 9000", got)
	}
}

// pipelineRun is one run of the pipeline against a partner API address.
type pipelineRun struct {
	sb             *testenv.Sandbox
	apiURL         string
	rootCAs        *x509.CertPool // nil: the system's
	requestTimeout time.Duration
	events         int
	rate           float64
	during         func(runFor time.Duration)
}

// runResult is what a run found.
type runResult struct {
	plays        int // expected plays, each delivered
	duplicates   int64
	inDoubtPlays uint64
	audit        *analytics.Audit
}

func (r runResult) hasCause(c string) bool {
	for _, x := range r.audit.DoubtfulPostsByCause {
		if x.Key == c && x.N > 0 {
			return true
		}
	}
	return false
}

// runPipeline publishes simulated events through the pipeline, waits until
// every expected play is delivered and audited, and checks the three
// promises of the edge suite.
func runPipeline(t *testing.T, pr pipelineRun) runResult {
	t.Helper()
	k := testenv.StartKafka(t, 3)
	ch := testenv.StartClickHouse(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	api := partnerapi.Config{BaseURL: pr.apiURL, RequestTimeout: pr.requestTimeout,
		Credentials: partnerapi.Credentials{ClientID: pr.sb.ClientID, ClientSignature: pr.sb.ClientSignature, Email: pr.sb.Email},
		BaseBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond, MaxAttempts: 8, RootCAs: pr.rootCAs}
	p, err := demo.Start(ctx, demo.Config{
		Kafka:      k.Config,
		API:        api,
		ClickHouse: analytics.Config{Addr: ch.Addr, Database: ch.Database, User: ch.User, Password: ch.Password},
		Consumer:   consumer.Config{TransactionalID: "edge-enrich"},
		Reporter:   reporter.Config{Concurrency: 16, ProbeInterval: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond},
		Sink:       analytics.SinkConfig{BatchRows: 2000, Linger: 100 * time.Millisecond, RetryMax: 500 * time.Millisecond},
		Logger:     testenv.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()

	mixes, err := simulator.CatalogFromAPI(ctx, p.API, 0)
	if err != nil {
		t.Fatal(err)
	}
	// One clock for the generation here and the run: the simulator holds
	// its devices to its clock, and the plays expected must be the plays
	// sent.
	simNow := time.Now()
	sim := simulator.Config{Kafka: p.Kafka, Mixes: mixes, Events: pr.events, Rate: pr.rate, Devices: 20, Seed: 7,
		StartMS: simNow.Add(-time.Hour).UnixMilli(), Now: func() time.Time { return simNow }}
	gen, err := simulator.NewGenerator(sim)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []simulator.Message
	for m, ok := gen.Next(); ok; m, ok = gen.Next() {
		msgs = append(msgs, m)
	}
	want, _, _, _, err := expect.Sim(pr.sb.Catalog(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	wantReports := 0
	for _, n := range want {
		wantReports += n
	}
	simDone := make(chan error, 1)
	go func() {
		st, err := simulator.Run(ctx, sim)
		if err == nil && st.Sent != len(msgs) {
			err = fmt.Errorf("simulator sent %d of %d", st.Sent, len(msgs))
		}
		simDone <- err
	}()
	if pr.during != nil {
		pr.during(time.Duration(float64(pr.events) / pr.rate * float64(time.Second)))
	}
	if err := <-simDone; err != nil {
		t.Fatal(err)
	}

	conn := ch.Conn(t)
	auditor, err := analytics.NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	window := analytics.AuditOptions{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	var rep *analytics.Audit
	deadline := time.Now().Add(2 * time.Minute)
	for {
		select {
		case err := <-p.Errors():
			t.Fatalf("a role failed: %v", err)
		default:
		}
		rep, err = auditor.Audit(ctx, window)
		if err == nil && rep.Pending == 0 && rep.Delivered == uint64(wantReports) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline did not settle: want %d plays delivered; audit %+v (err %v), sandbox %+v", wantReports, rep, err, pr.sb.Counts())
		}
		time.Sleep(300 * time.Millisecond)
	}
	// Every expected play at the partner, nothing unexpected.
	led := pr.sb.Ledger()
	copies := map[expect.Play]int{}
	for _, e := range led.Accepted {
		copies[expect.Of(e.Report)]++
	}
	got, duplicated := map[expect.Play]int{}, 0 // each expected play once; duplicates are counted apart
	for p, n := range copies {
		got[p] = n
		if w := want[p]; w > 0 && n > w {
			got[p] = w
			duplicated++
		}
	}
	if missing, extra := expect.Diff(want, got); len(missing)+len(extra) > 0 {
		t.Errorf("the partner's reports differ from the expected plays: %d missing (e.g. %v), %d unexpected (e.g. %v)",
			len(missing), expect.First(missing), len(extra), expect.First(extra))
	}
	var inDoubt uint64
	if err := conn.QueryRow(ctx, "SELECT uniqExact(report_id) FROM "+ch.Database+".deliveries WHERE in_doubt = 1").Scan(&inDoubt); err != nil {
		t.Fatal(err)
	}
	var doubtfulPosts uint64
	for _, c := range rep.DoubtfulPostsByCause {
		doubtfulPosts += c.N
	}
	r := runResult{plays: wantReports, duplicates: led.Duplicates, inDoubtPlays: inDoubt, audit: rep}
	if uint64(duplicated) > r.inDoubtPlays {
		t.Errorf("the partner holds duplicates of %d plays, but only %d plays are labelled in doubt", duplicated, r.inDoubtPlays)
	}
	if uint64(r.duplicates) > doubtfulPosts {
		t.Errorf("the partner holds %d duplicates, but only %d posts are labelled with a doubt cause", r.duplicates, doubtfulPosts)
	}
	if uint64(r.duplicates) > rep.PossibleExtraCopies {
		t.Errorf("the partner holds %d duplicates, but the audit bounds the extra copies at %d", r.duplicates, rep.PossibleExtraCopies)
	}
	if rep.RejectedByAPI != 0 {
		t.Errorf("%d plays rejected by the API: %v", rep.RejectedByAPI, rep.RejectedByAPIByMessage)
	}
	return r
}
