//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// brokerRig is the pipeline of the broker fault tests, every part its own
// process: the embedded broker (`playpipe broker`, so that it can be frozen
// and killed alone), ingest, consume, report and sink, with the sandbox and
// ClickHouse of testenv.
type brokerRig struct {
	t       *testing.T
	ps      *testenv.Procs
	sb      *testenv.Sandbox
	dir     string
	broker  string // host:port, the same across the broker's restarts
	brokerP *testenv.Proc
	roles   map[string]*role
	keys    map[string]string // fleet → API key
	ingest  string            // gateway address
	events  []simRecord       // valid events to post, in order
	next    int               // first of events not posted yet
	// kafkaArgs and chArgs are the roles' flags for the broker and the
	// ledger (for other commands run against the rig).
	kafkaArgs, chArgs []string
}

// deliveryTimeout is the gateway's --delivery-timeout in these tests.
const deliveryTimeout = 3 * time.Second

// frozenFor and downFor are how long the broker stays frozen (SIGSTOP) and
// dead (SIGKILL): several delivery timeouts, and a few dozen probes of every
// role (each a fault to log, at most once a minute).
const (
	frozenFor = 10 * time.Second
	downFor   = 10 * time.Second
)

func startBrokerRig(t *testing.T) *brokerRig {
	t.Helper()
	return newBrokerRig(t, false)
}

// startBrokerRigOnApache is the rig on Apache Kafka (one node started by
// the test, kafkanode) instead of the embedded broker's process: for the
// faults an operator causes through the admin API (a topic deleted and
// created again), which do not need to kill the broker.
func startBrokerRigOnApache(t *testing.T) *brokerRig {
	t.Helper()
	return newBrokerRig(t, true)
}

func newBrokerRig(t *testing.T, apache bool) *brokerRig {
	t.Helper()
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = 5, 1, 2, 4 })
	ch := testenv.StartClickHouse(t)
	r := &brokerRig{t: t, sb: sb, dir: dir, roles: map[string]*role{}, keys: map[string]string{"fleet-a": "pp_key_fleet_a_0123456789", "fleet-b": "pp_key_fleet_b_0123456789"}}
	r.ps = testenv.NewProcs(t, bin, dir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
	))
	if apache {
		r.broker = testenv.StartApacheKafka(t, testenv.ApacheKafka{Partitions: 3}).Addrs()[0]
	} else {
		r.broker = testenv.FreeAddr(t)
		r.startBroker()
	}
	kafkaArgs := []string{"--brokers", r.broker, "--partitions", "3"}
	chArgs := []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	r.kafkaArgs, r.chArgs = kafkaArgs, chArgs
	r.ingest = testenv.FreeAddr(t)
	var keyArgs []string
	for fleet, key := range r.keys {
		keyArgs = append(keyArgs, "--api-key", fleet+":"+gateway.HashKey(key))
	}
	add := func(name string, args ...string) {
		r.roles[name] = &role{name: name, args: args, admin: testenv.FreeAddr(t)}
	}
	add("sink", append(append([]string{"sink"}, kafkaArgs...), append(chArgs, "--batch-rows", "500", "--linger", "200ms", "--retry-max", "500ms")...)...)
	add("consume", append(append([]string{"consume"}, kafkaArgs...), "--api-url", sb.URL, "--transactional-id", "e2e-faults-enrich")...)
	add("report", append(append([]string{"report"}, kafkaArgs...), "--api-url", sb.URL, "--backoff-max", "500ms")...)
	add("ingest", append(append(append([]string{"ingest"}, kafkaArgs...), keyArgs...), "--addr", r.ingest, "--delivery-timeout", deliveryTimeout.String(), "--shutdown-timeout", "10s")...)
	for _, name := range []string{"sink", "consume", "report", "ingest"} {
		r.start(name)
	}
	for _, name := range []string{"sink", "consume", "report", "ingest"} {
		testenv.WaitReady(t, r.roles[name].p, r.roles[name].admin, 90*time.Second)
	}
	// Events whose started_at is an hour ago (plausible), on the sandbox's mixes.
	sa := simArgs{events: 400, rate: 1000, devices: 20, badShare: 0, seed: 22, startMS: time.Now().Add(-time.Hour).UnixMilli()}
	for _, m := range sa.generated(t, sb.URL, partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature}) {
		if m.Kind == "valid" {
			r.events = append(r.events, m)
		}
	}
	return r
}

func (r *brokerRig) startBroker() {
	_, port, _ := strings.Cut(r.broker, ":")
	r.brokerP = r.ps.Start("broker", "broker", "--port", port, "--partitions", "3")
	deadline := time.Now().Add(20 * time.Second)
	for {
		cl, err := kgo.NewClient(kgo.SeedBrokers(r.broker))
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err = cl.Ping(ctx)
			cancel()
			cl.Close()
		}
		if err == nil {
			return
		}
		if !r.brokerP.Running() || time.Now().After(deadline) {
			r.t.Fatalf("broker on %s not up: %v (log %s)", r.broker, err, r.brokerP.Log)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *brokerRig) start(name string) {
	ro := r.roles[name]
	ro.p = r.ps.Start(ro.name, append([]string{ro.args[0], "--admin-addr", ro.admin}, ro.args[1:]...)...)
}

// take returns the next n events not posted yet.
func (r *brokerRig) take(n int) []simRecord {
	r.t.Helper()
	if r.next+n > len(r.events) {
		r.t.Fatalf("only %d events generated", len(r.events))
	}
	out := r.events[r.next : r.next+n]
	r.next += n
	return out
}

// answer is one POST /v1/events answer.
type answer struct {
	status     int
	retryAfter string
	took       time.Duration
	body       gateway.IngestResponse
	err        error
}

// post sends events as one JSON array with fleet's key; the client waits
// up to wait.
func (r *brokerRig) post(fleet string, events []simRecord, wait time.Duration) answer {
	var body bytes.Buffer
	body.WriteByte('[')
	for i, e := range events {
		if i > 0 {
			body.WriteByte(',')
		}
		body.WriteString(e.Value)
	}
	body.WriteByte(']')
	req, _ := http.NewRequest(http.MethodPost, "http://"+r.ingest+"/v1/events", &body)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+r.keys[fleet])
	start := time.Now()
	resp, err := (&http.Client{Timeout: wait}).Do(req)
	a := answer{took: time.Since(start), err: err}
	if err != nil {
		return a
	}
	defer resp.Body.Close()
	a.status, a.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	b, _ := io.ReadAll(resp.Body)
	if err := json.Unmarshal(b, &a.body); err != nil && resp.StatusCode != http.StatusServiceUnavailable {
		a.err = fmt.Errorf("answer %d %q: %w", resp.StatusCode, b, err)
	}
	a.took = time.Since(start)
	return a
}

// readyz GETs a role's /readyz with a 1 s client timeout.
func readyz(addr string) (status int, body string, took time.Duration, err error) {
	start := time.Now()
	resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + addr + "/readyz")
	took = time.Since(start)
	if err != nil {
		return 0, "", took, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), time.Since(start), nil
}

// wantPlays returns the plays events must yield at the partner.
func (r *brokerRig) wantPlays(events []simRecord) map[play]int {
	r.t.Helper()
	want := map[play]int{}
	for _, e := range events {
		plays, _, err := expect.Event(r.sb.Catalog(), []byte(e.Value))
		if err != nil {
			r.t.Fatalf("expected plays: %v", err)
		}
		for _, p := range plays {
			want[p]++
		}
	}
	return want
}

// partnerPlays returns the plays the partner accepted (copies counted).
func (r *brokerRig) partnerPlays() map[play]int {
	got := map[play]int{}
	for _, e := range r.sb.LedgerSince(0).Accepted {
		got[expect.Of(e.Report)]++
	}
	return got
}

// waitDelivered waits up to d until the partner holds every play of want
// and returns how long that took.
func (r *brokerRig) waitDelivered(want map[play]int, d time.Duration) time.Duration {
	r.t.Helper()
	start := time.Now()
	for {
		got := r.partnerPlays()
		missing, _, _ := compare(want, got)
		if len(missing) == 0 {
			return time.Since(start)
		}
		if time.Since(start) > d {
			r.t.Fatalf("%d of the expected plays not at the partner after %s, e.g. %v", len(missing), d, firstPlays(missing, 3))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// eventCopies counts the records of plays.events per event_id (key).
func (r *brokerRig) eventCopies() map[string]int {
	r.t.Helper()
	out := map[string]int{}
	readTopic(r.t, r.broker, "plays.events", func(rec *kgo.Record) { out[string(rec.Key)]++ })
	return out
}

// readTopic calls fn for every record of topic on broker, from the start
// until three polls of 700 ms in a row bring nothing.
func readTopic(t *testing.T, broker, topic string, fn func(*kgo.Record)) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(broker), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatalf("kafka client: %v", err)
	}
	defer cl.Close()
	for quiet := 0; quiet < 3; {
		ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
		fs := cl.PollFetches(ctx)
		cancel()
		if fs.NumRecords() == 0 {
			quiet++
		}
		fs.EachRecord(fn)
	}
}

// faultLines counts, in a role's log, the lines from offset on that speak
// of a broker fault.
var faultLine = regexp.MustCompile(`(?i)UNKNOWN_TOPIC_ID|fault=|kafka: |broker|fetch error`)

func logLines(t *testing.T, path string, from int64) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("log: %v", err)
	}
	if from > int64(len(b)) {
		from = int64(len(b))
	}
	var out []string
	for _, l := range strings.Split(string(b[from:]), "\n") {
		if faultLine.MatchString(l) && !strings.HasPrefix(l, "=== ") {
			out = append(out, l)
		}
	}
	return out
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// supervisor restarts the roles of a rig that exit, as Kubernetes or
// systemd would, and records their exit codes.
type supervisor struct {
	r     *brokerRig
	mu    sync.Mutex
	exits map[string][]int
	stop  chan struct{}
	done  chan struct{}
}

func superviseRoles(r *brokerRig) *supervisor {
	s := &supervisor{r: r, exits: map[string][]int{}, stop: make(chan struct{}), done: make(chan struct{})}
	go func() { // owned by the test: close(stop), then <-done
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
			s.mu.Lock()
			for name, ro := range r.roles {
				if ro.p.Running() {
					continue
				}
				code := ro.p.Wait(r.t, time.Second)
				s.exits[name] = append(s.exits[name], code)
				r.start(name)
			}
			s.mu.Unlock()
		}
	}()
	r.t.Cleanup(func() {
		select {
		case <-s.stop:
		default:
			close(s.stop)
		}
		<-s.done
	})
	return s
}

// proc returns the running process of a role.
func (s *supervisor) proc(name string) *testenv.Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.r.roles[name].p
}

func (s *supervisor) exitCodes() map[string][]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]int{}
	for k, v := range s.exits {
		out[k] = append([]int(nil), v...)
	}
	return out
}
