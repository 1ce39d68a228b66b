//go:build linux

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/gateway"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/kafkanode"
	"github.com/playpipe/playpipe/testkit/netns"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// The three-node run's shape.
const (
	kcPartitions = 6
	// clusterDeliveryTimeout is the gateway's --delivery-timeout.
	clusterDeliveryTimeout = 5 * time.Second
	// clusterBatch events are posted every clusterPace (~35 events/s: each post takes a few ms to seconds).
	clusterBatch = 10
	clusterPace  = 250 * time.Millisecond
	// kcEvents are generated; the fleet posts ~35 a second for the whole
	// run (about 6 minutes past the setup).
	kcEvents = 14000
	// clusterLogLines bounds what one role may log over one fault and its
	// aftermath: a broker fault is worth a few lines, not a line per retry.
	clusterLogLines = 60
	// clusterTxnID is the enrich role's --transactional-id.
	clusterTxnID = "e2e-kc-enrich"
)

// clusterDownFor is how long one node stays down in the one-node-down
// case: PLAYPIPE_E2E_NODE_DOWN (a duration, e.g. 60s) or 30 s, so
// that the whole file finishes well within 10 minutes on a small machine.
func clusterDownFor(t *testing.T) time.Duration {
	if s := os.Getenv("PLAYPIPE_E2E_NODE_DOWN"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("PLAYPIPE_E2E_NODE_DOWN: %v", err)
		}
		return d
	}
	return 30 * time.Second
}

// fleet posts events through the gateway at a steady pace, as a fleet
// would: every event not answered accepted (failed, unknown) is posted
// again, under the same event_id, in a later batch, until accepted.
type fleet struct {
	r    *brokerRig
	stop chan struct{}
	done chan struct{}

	mu          sync.Mutex
	accepted    map[string]time.Time // event_id → when a post answered it accepted
	refused     []string             // events refused (a rule broken): a fault of the test's data
	firstPosted map[string]time.Time // event_id → when it was first posted
	retry       []simRecord
	posts       []fleetPost
	all         []simRecord // every event posted at least once
}

// fleetPost is one POST /v1/events and its answer.
type fleetPost struct {
	start time.Time
	a     answer
	n     int
}

func startFleet(r *brokerRig) *fleet {
	f := &fleet{r: r, stop: make(chan struct{}), done: make(chan struct{}), accepted: map[string]time.Time{}, firstPosted: map[string]time.Time{}}
	go func() { // owned by the test: f.halt()
		defer close(f.done)
		names := []string{"fleet-a", "fleet-b"}
		for i := 0; ; i++ {
			select {
			case <-f.stop:
				return
			case <-time.After(clusterPace):
			}
			f.mu.Lock()
			n := min(len(f.retry), clusterBatch)
			batch := append([]simRecord(nil), f.retry[:n]...)
			f.retry = f.retry[n:]
			now := time.Now()
			if fresh := clusterBatch - len(batch); r.next+fresh <= len(r.events) {
				for _, e := range r.events[r.next : r.next+fresh] {
					f.firstPosted[e.Key] = now
					f.all = append(f.all, e)
					batch = append(batch, e)
				}
				r.next += fresh
			}
			f.mu.Unlock()
			if len(batch) == 0 {
				continue
			}
			f.postOnce(names[i%2], batch)
		}
	}()
	return f
}

// postOnce posts batch and files every event by its answer.
func (f *fleet) postOnce(name string, batch []simRecord) {
	start := time.Now()
	a := f.r.post(name, batch, clusterDeliveryTimeout+20*time.Second)
	status := map[string]gateway.EventAnswer{}
	for _, e := range a.body.Events {
		status[e.EventID] = e
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.posts = append(f.posts, fleetPost{start: start, a: a, n: len(batch)})
	for _, e := range batch {
		switch ans := status[e.Key]; ans.Status {
		case "accepted":
			if _, ok := f.accepted[e.Key]; !ok {
				f.accepted[e.Key] = time.Now()
			}
		case "refused":
			f.refused = append(f.refused, fmt.Sprintf("%s: %v", e.Key, ans.Reasons))
		default:
			f.retry = append(f.retry, e)
		}
	}
}

// halt stops posting new events, then posts what is left to retry until
// every event is accepted (bounded).
func (f *fleet) halt(t *testing.T) {
	t.Helper()
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	<-f.done
	deadline := time.Now().Add(90 * time.Second)
	for {
		f.mu.Lock()
		retry := f.retry
		f.retry = nil
		f.mu.Unlock()
		if len(retry) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d events still not accepted by the gateway 90 s after the faults", len(retry))
		}
		for len(retry) > 0 {
			n := min(len(retry), clusterBatch)
			f.postOnce("fleet-a", retry[:n])
			retry = retry[n:]
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// postsBetween returns the posts begun in [from, to).
func (f *fleet) postsBetween(from, to time.Time) []fleetPost {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []fleetPost
	for _, p := range f.posts {
		if !p.start.Before(from) && p.start.Before(to) {
			out = append(out, p)
		}
	}
	return out
}

// gatewayResume is how long after t0 the first post begun at or after t0
// was answered 202 (every event accepted); waits up to d.
func (f *fleet) gatewayResume(t *testing.T, t0 time.Time, d time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		f.mu.Lock()
		for _, p := range f.posts {
			if !p.start.Before(t0) && p.a.status == http.StatusAccepted {
				f.mu.Unlock()
				return p.start.Add(p.a.took).Sub(t0)
			}
		}
		f.mu.Unlock()
		if time.Now().After(deadline) {
			t.Errorf("the gateway accepted no post begun after %s within %s", t0.Format("15:04:05.000"), d)
			return -1
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// gap is the longest time between two 202 answers (by their end) of posts
// begun in [from, to).
func (f *fleet) gap(from, to time.Time) time.Duration {
	var ends []time.Time
	for _, p := range f.postsBetween(from, to) {
		if p.a.status == http.StatusAccepted {
			ends = append(ends, p.start.Add(p.a.took))
		}
	}
	sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
	var g time.Duration
	prev := from
	for _, e := range ends {
		g = max(g, e.Sub(prev))
		prev = e
	}
	return max(g, to.Sub(prev))
}

// timeline says the posts begun in [from, to) in short: the offset of
// their start from t0, the status, and the events' fates when not all
// accepted (a accepted, f failed, u unknown).
func (f *fleet) timeline(t0, from, to time.Time) string {
	var b strings.Builder
	for _, p := range f.postsBetween(from, to) {
		fmt.Fprintf(&b, " %+.1fs:%d", p.start.Sub(t0).Seconds(), p.a.status)
		if p.a.status != http.StatusAccepted {
			fmt.Fprintf(&b, "(a%d f%d u%d, %.1fs)", p.a.body.Accepted, p.a.body.Failed, p.a.body.Unknown, p.a.took.Seconds())
		}
	}
	return strings.TrimSpace(b.String())
}

// firstEventAfter is how long after t0 a post begun at or after t0 first
// had an event accepted (a partial answer counts); -1 if none within d.
func (f *fleet) firstEventAfter(t0 time.Time, d time.Duration) time.Duration {
	deadline := time.Now().Add(d)
	for {
		f.mu.Lock()
		for _, p := range f.posts {
			if !p.start.Before(t0) && p.a.body.Accepted > 0 {
				f.mu.Unlock()
				return p.start.Add(p.a.took).Sub(t0)
			}
		}
		f.mu.Unlock()
		if time.Now().After(deadline) {
			return -1
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// clusterRig is the pipeline as processes on three Apache Kafka brokers and
// two controller-only nodes, with a fleet posting through the gateway.
type clusterRig struct {
	*brokerRig
	k   *testenv.Kafka
	bin string
	fl  *fleet
	sup *supervisor
	// net is the namespace of node 3, nil when none could be made (noNet
	// says why).
	net   *clusterNet
	noNet string

	mu       sync.Mutex
	eventOf  map[play]string      // play → the event that yields it
	ledSeq   uint64               // ledger entries read up to
	firstArr map[string]time.Time // event_id → arrival of its first play at the partner
}

// partnerResume is how long after t0 the partner first accepted a play of
// an event first posted at or after t0 (end to end: gateway, consume,
// report); waits up to d.
func (c *clusterRig) partnerResume(t *testing.T, t0 time.Time, d time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		c.mu.Lock()
		for _, e := range c.sb.LedgerSince(c.ledSeq).Accepted {
			c.ledSeq = max(c.ledSeq, e.Seq)
			if id, ok := c.eventOf[expect.Of(e.Report)]; ok {
				if _, seen := c.firstArr[id]; !seen {
					c.firstArr[id] = e.Arrival
				}
			}
		}
		found, best := false, time.Duration(0)
		c.fl.mu.Lock()
		for id, arr := range c.firstArr {
			if p, ok := c.fl.firstPosted[id]; !ok || p.Before(t0) {
				continue
			}
			if d := arr.Sub(t0); !found || d < best {
				found, best = true, d
			}
		}
		c.fl.mu.Unlock()
		c.mu.Unlock()
		if found {
			return best
		}
		if time.Now().After(deadline) {
			t.Errorf("no play of an event posted after %s reached the partner within %s", t0.Format("15:04:05.000"), d)
			return -1
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// logSizes returns every role's log size (to count the lines of a fault).
func (c *clusterRig) logSizes() map[string]int64 {
	out := map[string]int64{}
	for name, ro := range c.roles {
		out[name] = fileSize(c.ps.LogPath(ro.name)) // not ro.p: the supervisor replaces it on a restart
	}
	return out
}

// checkLogLines counts the lines each role wrote since from and fails a
// role past clusterLogLines; it returns the counts for the record.
func (c *clusterRig) checkLogLines(t *testing.T, fault string, from map[string]int64) string {
	t.Helper()
	var parts []string
	names := make([]string, 0, len(c.roles))
	for name := range c.roles {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		b, err := os.ReadFile(c.ps.LogPath(c.roles[name].name))
		if err != nil {
			t.Errorf("log of %s: %v", name, err)
			continue
		}
		if f := from[name]; f <= int64(len(b)) {
			b = b[f:]
		}
		var lines []string
		for _, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
			if l != "" && !strings.HasPrefix(l, "=== ") {
				lines = append(lines, l)
			}
		}
		parts = append(parts, fmt.Sprintf("%s %d", name, len(lines)))
		if len(lines) > clusterLogLines {
			show := lines
			if len(show) > 15 {
				show = show[len(show)-15:]
			}
			t.Errorf("%s wrote %d log lines over %s, want at most %d; the last:\n%s", name, len(lines), fault, clusterLogLines, strings.Join(show, "\n"))
		}
	}
	return strings.Join(parts, ", ")
}

// txnCoordinator is the broker coordinating the transactional id's
// transactions.
func (c *clusterRig) txnCoordinator(t *testing.T, id string) int32 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	r, ok := kadm.NewClient(c.k.Client(t)).FindTxnCoordinators(ctx, id)[id]
	if !ok || r.Err != nil {
		t.Fatalf("the transaction coordinator of %s: %v", id, r.Err)
	}
	return r.NodeID
}

// leaders returns, per broker id, the partitions of the four topics it
// leads and the records they hold (log end offsets).
func (c *clusterRig) leaders(t *testing.T) (parts, records map[int32]int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	adm := kadm.NewClient(c.k.Client(t))
	topics := c.k.Config.Topics().All()
	td, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		t.Fatalf("list topics: %v", err)
	}
	ends, err := adm.ListEndOffsets(ctx, topics...)
	if err != nil {
		t.Fatalf("end offsets: %v", err)
	}
	parts, records = map[int32]int64{}, map[int32]int64{}
	for _, topic := range td.Sorted() {
		for _, p := range topic.Partitions.Sorted() {
			parts[p.Leader]++
			if o, ok := ends.Lookup(topic.Topic, p.Partition); ok {
				records[p.Leader] += o.Offset
			}
		}
	}
	return parts, records
}

// view says the cluster as broker seed sees it: the partitions each broker
// leads, how many partitions lack a replica in their ISR, and the active
// controller.
func (c *clusterRig) view(seed string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seed), kgo.DialTimeout(2*time.Second))
	if err != nil {
		return err.Error()
	}
	defer cl.Close()
	td, err := kadm.NewClient(cl).ListTopics(ctx, c.k.Config.Topics().All()...)
	if err != nil {
		return "metadata: " + err.Error()
	}
	leads := map[int32]int{}
	short := map[int32]int{} // broker → partitions whose ISR lacks it
	for _, topic := range td.Sorted() {
		for _, p := range topic.Partitions.Sorted() {
			leads[p.Leader]++
			for _, r := range p.Replicas {
				if !slices.Contains(p.ISR, r) {
					short[r]++
				}
			}
		}
	}
	return fmt.Sprintf("leaders %v, out of the ISR %v", leads, short)
}

// node returns the node with id, failing the test if none.
func (c *clusterRig) node(t *testing.T, id int) *kafkanode.Node {
	t.Helper()
	n := c.k.Apache.Node(id)
	if n == nil {
		t.Fatalf("no node %d", id)
	}
	return n
}

// restart starts n again and waits until every partition is in sync.
func (c *clusterRig) restart(t *testing.T, n *kafkanode.Node) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.k.Apache.Restart(ctx, n); err != nil {
		t.Fatalf("restart node %d: %v", n.ID, err)
	}
	c.k.WaitInSync(t, 3*time.Minute)
	return time.Since(start)
}

// startClusterRig starts Apache Kafka (3 brokers, 2 controller-only nodes),
// the sandbox, ClickHouse, and ingest, consume, report ×2 and sink as
// processes, supervised (restarted should one exit), with a fleet posting.
func startClusterRig(t *testing.T) *clusterRig {
	t.Helper()
	testStart := time.Now()
	dir := t.TempDir()
	bin := testenv.BuildPlaypipe(t, dir)
	cn, noNet := setupClusterNet(t)
	opts := testenv.ApacheKafka{Nodes: 3, Controllers: 2, Partitions: kcPartitions}
	if cn != nil {
		opts.NodeAddr = cn.Addr
		opts.Prefix = map[int][]string{cn.Node: cn.Exec()}
		t.Logf("network: node %d in namespace %s at %s, the others on %s (veth %s)", cn.Node, cn.Name, cn.NSIP, cn.HostIP, cn.HostIf)
	} else {
		t.Logf("network: no namespace (%s): every node on loopback, the network partition is skipped", noNet)
	}
	k := testenv.StartApacheKafka(t, opts)
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = 5, 1, 2, 4 })
	ch := testenv.StartClickHouse(t)
	logDir := dir
	if d := os.Getenv("PLAYPIPE_E2E_LOGDIR"); d != "" {
		logDir = d + "/" + time.Now().Format("20060102T150405")
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatalf("PLAYPIPE_E2E_LOGDIR: %v", err)
		}
		t.Logf("process logs in %s", logDir)
	}
	r := &brokerRig{t: t, sb: sb, dir: dir, roles: map[string]*role{}, keys: map[string]string{"fleet-a": "pp_key_fleet_a_0123456789", "fleet-b": "pp_key_fleet_b_0123456789"}}
	r.ps = testenv.NewProcs(t, bin, logDir, testenv.ChildEnv(
		"PLAYPIPE_API_CLIENT_ID="+sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE="+sb.ClientSignature,
		"PLAYPIPE_LOG_LEVEL=info",
	))
	r.broker = k.Addrs()[0]
	r.kafkaArgs = []string{"--brokers", strings.Join(k.Addrs(), ","), "--partitions", fmt.Sprint(kcPartitions)}
	r.chArgs = []string{"--clickhouse-addr", ch.Addr, "--clickhouse-db", ch.Database, "--clickhouse-user", ch.User}
	r.ingest = testenv.FreeAddr(t)
	var keyArgs []string
	for name, key := range r.keys {
		keyArgs = append(keyArgs, "--api-key", name+":"+gateway.HashKey(key))
	}
	add := func(name string, args ...string) {
		r.roles[name] = &role{name: name, args: args, admin: testenv.FreeAddr(t)}
	}
	add("sink", append(append([]string{"sink"}, r.kafkaArgs...), append(r.chArgs, "--instance-id", "e2e-kc-sink", "--batch-rows", "500", "--linger", "200ms", "--retry-max", "500ms")...)...)
	add("consume", append(append([]string{"consume"}, r.kafkaArgs...), "--api-url", sb.URL, "--instance-id", "e2e-kc-consume", "--transactional-id", clusterTxnID)...)
	for i := range 2 {
		add(fmt.Sprintf("report-%d", i), append(append([]string{"report"}, r.kafkaArgs...), "--api-url", sb.URL, "--instance-id", fmt.Sprintf("e2e-kc-report-%d", i),
			"--concurrency", "8", "--max-concurrency", "8", "--backoff-max", "500ms")...)
	}
	add("ingest", append(append(append([]string{"ingest"}, r.kafkaArgs...), keyArgs...), "--addr", r.ingest, "--delivery-timeout", clusterDeliveryTimeout.String(), "--shutdown-timeout", "10s")...)
	names := []string{"sink", "consume", "report-0", "report-1", "ingest"}
	r.start("sink")
	testenv.WaitReady(t, r.roles["sink"].p, r.roles["sink"].admin, 90*time.Second) // the schema, alone
	for _, name := range names[1:] {
		r.start(name)
	}
	for _, name := range names[1:] {
		testenv.WaitReady(t, r.roles[name].p, r.roles[name].admin, 90*time.Second)
	}
	// 20 plays per device: the events' started_at stay within a few hours
	// of now (more per device would run past the gateway's plausible-time
	// window, a day ahead, and be refused).
	sa := simArgs{events: kcEvents, rate: 1000, devices: kcEvents / 20, badShare: 0, seed: 31, startMS: time.Now().Add(-2 * time.Hour).UnixMilli()}
	c := &clusterRig{brokerRig: r, k: k, bin: bin, net: cn, noNet: noNet, eventOf: map[play]string{}, firstArr: map[string]time.Time{}}
	for _, m := range sa.generated(t, sb.URL, partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature}) {
		if m.Kind != "valid" {
			continue
		}
		plays, _, err := expect.Event(sb.Catalog(), []byte(m.Value))
		if err != nil {
			t.Fatalf("expected plays: %v", err)
		}
		for _, p := range plays {
			c.eventOf[p] = m.Key
		}
		r.events = append(r.events, m)
	}
	c.sup = superviseRoles(r)
	t.Logf("setup: Apache Kafka %s (brokers %v), sandbox, ClickHouse, 5 roles ready in %s; %d events to post", k.Apache.Version(), k.Addrs(), time.Since(testStart).Round(time.Millisecond), len(r.events))
	return c
}

// TestKafkaClusterFaults runs the pipeline as processes
// (ingest, consume, report ×2, sink) under a steady load posted through
// the gateway, on a three-broker Apache Kafka (replication factor 3,
// min.insync.replicas 2) with two controller-only nodes, through one fault
// after the other: kill -9 of the leader of the busiest partitions, kill -9
// of the active controller, two brokers down (the gateway answers 503 with
// each event's fate within --delivery-timeout; the roles wait), a rolling
// restart of the three brokers, and one broker down for a while. After
// each, the time to resume is logged and the roles' log lines are counted;
// at the end no event the gateway accepted is lost, the partner's
// duplicates are within the audit's possible extra copies, and the audit
// agrees with the partner.
func TestKafkaClusterFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: starts 5 Apache Kafka nodes and 5 processes")
	}
	testStart := time.Now()
	c := startClusterRig(t)
	c.fl = startFleet(c.brokerRig)
	// Warm up: the pipeline delivers before the first fault.
	t0 := time.Now()
	first := c.partnerResume(t, t0, 90*time.Second)
	t.Logf("%6s warm: the first play at the partner %s after the fleet began", since(testStart), first.Round(time.Millisecond))
	time.Sleep(5 * time.Second)
	var figures []string

	// Kill -9 the broker that leads the busiest partitions.
	t.Run("KillLeader", func(t *testing.T) {
		parts, records := c.leaders(t)
		var victim int32 = -1
		for id, n := range records {
			if victim < 0 || n > records[victim] {
				victim = id
			}
		}
		n := c.node(t, int(victim))
		logFrom := c.logSizes()
		n.Kill()
		at := time.Now()
		t.Logf("%6s kill -9 node %d (pid gone), leader of %d partitions holding %d records (leaders: %v)", since(testStart), n.ID, parts[victim], records[victim], parts)
		gw := c.fl.gatewayResume(t, at, 60*time.Second)
		pr := c.partnerResume(t, at, 90*time.Second)
		time.Sleep(5 * time.Second) // down a while longer
		back := c.restart(t, n)
		t.Logf("%6s node %d back and in sync in %s", since(testStart), n.ID, back.Round(time.Millisecond))
		t.Logf("posts after the kill: %s", c.fl.timeline(at, at, at.Add(pr+2*time.Second)))
		lines := c.checkLogLines(t, "the leader's kill", logFrom)
		figures = append(figures, fmt.Sprintf("kill -9 leader (node %d): gateway 202 after %s, partner after %s, longest gap between 202s %s; log lines %s",
			n.ID, gw.Round(time.Millisecond), pr.Round(time.Millisecond), c.fl.gap(at, at.Add(pr)).Round(time.Millisecond), lines))
		t.Log(figures[len(figures)-1])
	})

	// Kill -9 the active controller.
	t.Run("KillController", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		id, err := c.k.Apache.ActiveController(ctx)
		cancel()
		if err != nil {
			t.Fatalf("active controller: %v", err)
		}
		n := c.node(t, id)
		logFrom := c.logSizes()
		n.Kill()
		at := time.Now()
		t.Logf("%6s kill -9 the active controller, node %d (broker too: %v)", since(testStart), id, n.Broker != "")
		var newID int
		for deadline := time.Now().Add(60 * time.Second); ; {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			newID, err = c.k.Apache.ActiveController(ctx)
			cancel()
			if err == nil && newID != id {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no new active controller within 60 s (last %d, %v)", newID, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		elected := time.Since(at)
		gw := c.fl.gatewayResume(t, at, 60*time.Second)
		pr := c.partnerResume(t, at, 90*time.Second)
		time.Sleep(5 * time.Second)
		back := c.restart(t, n)
		t.Logf("%6s node %d back in %s", since(testStart), id, back.Round(time.Millisecond))
		lines := c.checkLogLines(t, "the controller's kill", logFrom)
		figures = append(figures, fmt.Sprintf("kill -9 active controller (node %d → %d elected after %s): gateway 202 after %s, partner after %s; log lines %s",
			id, newID, elected.Round(time.Millisecond), gw.Round(time.Millisecond), pr.Round(time.Millisecond), lines))
		t.Log(figures[len(figures)-1])
	})

	// Two of the three brokers down: writes need two in-sync replicas.
	t.Run("TwoNodesDown", func(t *testing.T) {
		// The two killed include the enrich role's transaction coordinator,
		// the worst case for it: its transaction cannot be ended, and its
		// Kafka session is made again in place (the role must not exit).
		brokers := c.k.Apache.Brokers()
		coord := c.txnCoordinator(t, clusterTxnID)
		keep := 0
		if brokers[0].ID == int(coord) {
			keep = 1
		}
		var down []*kafkanode.Node
		for i, n := range brokers {
			if i != keep {
				down = append(down, n)
			}
		}
		t.Logf("the enrich role's transaction coordinator is node %d; node %d is left", coord, brokers[keep].ID)
		logFrom := c.logSizes()
		acceptedBefore := c.sb.Counts().Accepted
		for _, n := range down {
			n.Kill()
		}
		at := time.Now()
		t.Logf("%6s kill -9 nodes %d and %d: one broker left", since(testStart), down[0].ID, down[1].ID)
		const hold = 20 * time.Second
		time.Sleep(hold)
		// What each role's /readyz says meanwhile: one broker still answers
		// metadata requests, but every role that writes (acks=all, two
		// in-sync replicas asked) is not ready, naming the cause; the sink,
		// which writes no topic, stays ready.
		var ready []string
		for _, name := range []string{"ingest", "consume", "report-0", "report-1", "sink"} {
			st, body, _, err := readyz(c.roles[name].admin)
			if err != nil {
				ready = append(ready, fmt.Sprintf("%s: %v", name, err))
				t.Errorf("%s /readyz with two brokers down: %v", name, err)
				continue
			}
			ready = append(ready, fmt.Sprintf("%s: %d %s", name, st, strings.TrimSpace(body)))
			if name != "sink" && (st != http.StatusServiceUnavailable || !strings.Contains(body, "NOT_ENOUGH_REPLICAS")) {
				t.Errorf("%s /readyz with two brokers down: %d %s, want 503 naming NOT_ENOUGH_REPLICAS (its writes fail)", name, st, strings.TrimSpace(body))
			}
		}
		t.Logf("/readyz with two brokers down: %s", strings.Join(ready, "; "))
		// The gateway: 503 with each event's fate, within the delivery
		// timeout, for every post begun once the brokers knew (after 3 s).
		posts := c.fl.postsBetween(at.Add(3*time.Second), time.Now().Add(-clusterDeliveryTimeout-2*time.Second))
		var n503, nAccepted, unknown, failed int
		var slowest time.Duration
		for _, p := range posts {
			slowest = max(slowest, p.a.took)
			if p.a.err != nil {
				t.Errorf("a post while two brokers are down: no answer after %s: %v", p.a.took, p.a.err)
				continue
			}
			if p.a.took > clusterDeliveryTimeout+2*time.Second {
				t.Errorf("a post while two brokers are down answered after %s, want within --delivery-timeout %s (+2 s)", p.a.took.Round(time.Millisecond), clusterDeliveryTimeout)
			}
			if p.a.status != http.StatusServiceUnavailable {
				if p.a.status == http.StatusAccepted {
					nAccepted++
				} else {
					t.Errorf("a post while two brokers are down: %d, want 503", p.a.status)
				}
				continue
			}
			n503++
			if p.a.retryAfter == "" || len(p.a.body.Events) != p.n {
				t.Errorf("503 with Retry-After %q and %d per-event answers for %d events: want Retry-After and each event's fate", p.a.retryAfter, len(p.a.body.Events), p.n)
			}
			for _, e := range p.a.body.Events {
				switch e.Status {
				case "unknown":
					unknown++
				case "failed":
					failed++
				case "refused":
					// a rule broken: the data's fault, reported at the end
				default:
					t.Errorf("event %s: %q while two brokers are down", e.EventID, e.Status)
				}
			}
		}
		if n503 == 0 {
			t.Errorf("no 503 among %d posts while two brokers were down (%d accepted)", len(posts), nAccepted)
		}
		// The roles wait: none exits, the partner gets nothing new once the
		// pipeline has drained what was committed before.
		t.Logf("%6s while two brokers are down: %d posts, %d answered 503 (%d events unknown, %d failed), %d accepted; slowest answer %s; partner accepted %d since the kill",
			since(testStart), len(posts), n503, unknown, failed, nAccepted, slowest.Round(time.Millisecond), c.sb.Counts().Accepted-acceptedBefore)
		back := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		if err := c.k.Apache.Restart(ctx, down[0]); err != nil {
			cancel()
			t.Fatalf("restart node %d: %v", down[0].ID, err)
		}
		cancel()
		up := time.Since(back)
		gw := c.fl.gatewayResume(t, back, 90*time.Second)
		pr := c.partnerResume(t, back, 120*time.Second)
		t.Logf("%6s node %d back (registered after %s): gateway 202 after %s, partner after %s", since(testStart), down[0].ID, up.Round(time.Millisecond), gw.Round(time.Millisecond), pr.Round(time.Millisecond))
		t.Logf("posts from the kill (+0s) to the partner's resume: %s", c.fl.timeline(at, at, back.Add(pr)))
		c.restart(t, down[1])
		// Whether a transaction was open at the kill (then its End failed
		// and the enrich role made a new Kafka session in place), for the
		// record: with no event in flight none is.
		for _, l := range testenv.GrepLog(c.ps.LogPath(c.roles["consume"].name), "Kafka session") {
			t.Logf("consume: %s", l)
		}
		lines := c.checkLogLines(t, "two brokers down", logFrom)
		figures = append(figures, fmt.Sprintf("two brokers down %s: %d/%d posts 503 (slowest %s; %d unknown, %d failed); after one returned (registered %s): gateway 202 after %s, partner after %s; log lines %s",
			hold, n503, len(posts), slowest.Round(time.Millisecond), unknown, failed, up.Round(time.Millisecond), gw.Round(time.Millisecond), pr.Round(time.Millisecond), lines))
		t.Log(figures[len(figures)-1])
	})

	// A rolling restart: each broker in turn stopped (SIGTERM, a controlled
	// shutdown), started again, and in sync before the next.
	t.Run("RollingRestart", func(t *testing.T) {
		logFrom := c.logSizes()
		at := time.Now()
		var each []string
		for _, n := range c.k.Apache.Brokers() {
			from := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			err := n.Stop(ctx)
			cancel()
			if err != nil {
				t.Fatalf("stop node %d: %v", n.ID, err)
			}
			stopped := time.Since(from)
			c.restart(t, n)
			each = append(each, fmt.Sprintf("node %d: stopped in %s, back in sync after %s, longest gap between 202s %s", n.ID,
				stopped.Round(time.Millisecond), time.Since(from).Round(time.Millisecond), c.fl.gap(from, time.Now()).Round(time.Millisecond)))
			t.Logf("%6s %s", since(testStart), each[len(each)-1])
		}
		pr := c.partnerResume(t, time.Now(), 90*time.Second)
		lines := c.checkLogLines(t, "the rolling restart", logFrom)
		figures = append(figures, fmt.Sprintf("rolling restart in %s (%s); a fresh event at the partner %s after; log lines %s",
			time.Since(at).Round(time.Millisecond), strings.Join(each, "; "), pr.Round(time.Millisecond), lines))
		t.Log(figures[len(figures)-1])
	})

	// One broker down for a while: everything goes on.
	t.Run("OneNodeDown", func(t *testing.T) {
		downFor := clusterDownFor(t)
		n := c.k.Apache.Brokers()[0]
		logFrom := c.logSizes()
		acceptedBefore := c.sb.Counts().Accepted
		n.Kill()
		at := time.Now()
		t.Logf("%6s kill -9 node %d for %s", since(testStart), n.ID, downFor)
		gw := c.fl.gatewayResume(t, at, 60*time.Second)
		pr := c.partnerResume(t, at, 90*time.Second)
		time.Sleep(time.Until(at.Add(downFor)))
		// Once the gateway has resumed, every post is accepted.
		posts := c.fl.postsBetween(at.Add(max(gw, 0)), time.Now().Add(-clusterDeliveryTimeout-2*time.Second))
		bad := 0
		for _, p := range posts {
			if p.a.status != http.StatusAccepted {
				bad++
			}
		}
		if bad > 0 {
			t.Errorf("%d of %d posts not answered 202 while one broker was down", bad, len(posts))
		}
		moved := c.sb.Counts().Accepted - acceptedBefore
		if moved == 0 {
			t.Errorf("the partner accepted nothing while one broker was down")
		}
		back := c.restart(t, n)
		lines := c.checkLogLines(t, "one broker down", logFrom)
		figures = append(figures, fmt.Sprintf("one broker down %s: gateway 202 after %s, partner after %s, then %d of %d posts not 202, partner accepted %d meanwhile, node back in sync in %s; log lines %s",
			downFor, gw.Round(time.Millisecond), pr.Round(time.Millisecond), bad, len(posts), moved, back.Round(time.Millisecond), lines))
		t.Log(figures[len(figures)-1])
	})

	// One broker cut off by a network partition: its packets dropped
	// silently (nftables in its namespace).
	t.Run("NetworkPartition", func(t *testing.T) {
		if c.net == nil {
			t.Skipf("no network namespace for a broker here (%s): the partition is not tested", c.noNet)
		}
		const cutFor = 30 * time.Second
		n := c.node(t, c.net.Node)
		logFrom := c.logSizes()
		acceptedBefore := c.sb.Counts().Accepted
		t.Logf("before the cut: %s", c.view(c.k.Apache.Brokers()[0].Broker))
		c.net.cut(t)
		at := time.Now()
		healed := false
		defer func() {
			if !healed {
				c.net.heal(t)
			}
		}()
		t.Logf("%6s node %d cut off: every packet of namespace %s dropped", since(testStart), n.ID, c.net.Name)
		part := c.fl.firstEventAfter(at, cutFor)
		// While cut off the pipeline must go on without node 3. Alone this
		// takes 22–43 s; in CI, beside the other packages' tests on 2 cores,
		// the reporters' recovery after the rebalance waited on the silent
		// node (listing and reading plays.deliveries, claiming the
		// parked-state fence: 10 s attempts, each spent on a request to
		// it) until 96 s after the cut, and one reporter exited after three
		// failed attempts (restarted by the supervisor). docs/kafka.md keeps
		// that as a known limit; the bound allows it.
		pr := c.partnerResume(t, at, 150*time.Second)
		time.Sleep(time.Until(at.Add(cutFor)))
		t.Logf("%6s after %s cut off: seen from node 1: %s", since(testStart), cutFor, c.view(c.k.Apache.Brokers()[0].Broker))
		for _, nd := range c.k.Apache.Nodes() {
			var fenced []string
			for _, l := range testenv.GrepLog(nd.LogPath(), "ence") {
				if strings.Contains(l, "3") {
					fenced = append(fenced, l)
				}
			}
			if len(fenced) > 3 {
				fenced = fenced[len(fenced)-3:]
			}
			if len(fenced) > 0 {
				t.Logf("node %d's log on fencing: %s", nd.ID, strings.Join(fenced, " | "))
			}
		}
		posts := c.fl.postsBetween(at, time.Now())
		n503 := 0
		for _, p := range posts {
			if p.a.status != http.StatusAccepted {
				n503++
			}
		}
		moved := c.sb.Counts().Accepted - acceptedBefore
		if moved == 0 {
			t.Errorf("the partner accepted nothing while node %d was cut off", n.ID)
		}
		c.net.heal(t)
		healed = true
		healAt := time.Now()
		c.k.WaitInSync(t, 3*time.Minute)
		inSync := time.Since(healAt)
		gw := c.fl.gatewayResume(t, at, 90*time.Second)
		t.Logf("posts from the cut (+0s) to 15 s after the heal (+%.0fs): %s", healAt.Sub(at).Seconds(), c.fl.timeline(at, at, healAt.Add(15*time.Second)))
		lines := c.checkLogLines(t, "the network partition", logFrom)
		figures = append(figures, fmt.Sprintf("node %d cut off %s (packets dropped): gateway: an event accepted after %s, a whole post 202 after %s; partner after %s; %d of %d posts during the cut not 202, partner accepted %d meanwhile; in sync %s after the heal; log lines %s",
			n.ID, cutFor, part.Round(time.Millisecond), gw.Round(time.Millisecond), pr.Round(time.Millisecond), n503, len(posts), moved, inSync.Round(time.Millisecond), lines))
		t.Log(figures[len(figures)-1])
	})

	// The end: every accepted event's plays at the partner, the audit
	// agreeing.
	c.fl.halt(t)
	c.fl.mu.Lock()
	var acc []simRecord
	for _, e := range c.fl.all {
		if _, ok := c.fl.accepted[e.Key]; ok {
			acc = append(acc, e)
		}
	}
	posts := len(c.fl.posts)
	refused := c.fl.refused
	exhausted := c.next >= len(c.events)
	c.fl.mu.Unlock()
	if len(refused) > 0 {
		t.Errorf("the gateway refused %d events (the test's data broke a rule), e.g. %v", len(refused), refused[:min(3, len(refused))])
	}
	if exhausted {
		t.Errorf("the fleet ran out of events before the end: more are needed (kcEvents)")
	}
	want := c.wantPlays(acc)
	wantReports := 0
	for _, n := range want {
		wantReports += n
	}
	drain := c.waitDelivered(want, 3*time.Minute)
	t.Logf("%6s %d events accepted by the gateway (%d posts) → %d reports; all at the partner %s after the fleet stopped", since(testStart), len(acc), posts, wantReports, drain.Round(time.Millisecond))
	auditArgs := append(append([]string{"audit"}, c.chArgs...), "--from", "-3h", "--to", "+1h", "--format", "json")
	var rep analytics.Audit
	deadline := time.Now().Add(2 * time.Minute)
	for {
		rep = runAudit(t, c.bin, auditArgs)
		if rep.Delivered >= uint64(wantReports) && rep.Pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the audit sees %d delivered, %d pending after 2 min; want %d delivered", rep.Delivered, rep.Pending, wantReports)
		}
		time.Sleep(time.Second)
	}
	time.Sleep(2 * time.Second) // late copies
	led := c.sb.Ledger()
	got := map[play]int{}
	for _, e := range led.Accepted {
		got[expect.Of(e.Report)]++
	}
	missing, dups, unexpected := compare(want, got)
	if len(missing) > 0 || len(unexpected) > 0 {
		t.Errorf("the partner's ledger differs from the accepted events' plays: %d missing (first %v), %d unexpected (first %v)",
			len(missing), firstPlays(missing, 3), len(unexpected), firstPlays(unexpected, 3))
	}
	rep = runAudit(t, c.bin, auditArgs)
	if rep.PossibleExtraCopies < uint64(dups) {
		t.Errorf("audit: possible extra copies %d, fewer than the partner's %d duplicates (by cause %v)", rep.PossibleExtraCopies, dups, rep.DoubtfulPostsByCause)
	}
	if rep.Delivered != uint64(led.AcceptedCount-led.Duplicates) || rep.Delivered != uint64(wantReports) {
		t.Errorf("audit delivered %d; the partner holds %d distinct plays, %d expected", rep.Delivered, led.AcceptedCount-led.Duplicates, wantReports)
	}
	if rep.Pending != 0 || rep.RejectedByAPI != 0 {
		t.Errorf("audit: pending %d, rejected %d; want 0", rep.Pending, rep.RejectedByAPI)
	}
	// Delivered twice on record is allowed here (unlike in the scale-out
	// test): a partition lost with the group's coordinator (a broker
	// killed) is handed over with its posts in flight in doubt; the new
	// owner re-posts them and the old owner's late answer is recorded too
	// (docs/reporter.md). The audit counts each such copy.
	if rep.DeliveredTwice > rep.PossibleExtraCopies {
		t.Errorf("audit: %d plays delivered twice on record, more than its %d possible extra copies", rep.DeliveredTwice, rep.PossibleExtraCopies)
	}
	if codes := c.sup.exitCodes(); len(codes) > 0 {
		t.Errorf("roles exited on their own during the broker faults (restarted by the supervisor): %v", codes)
	}
	for _, f := range figures {
		t.Logf("figure: %s", f)
	}
	t.Logf("figures: %d plays, partner duplicates %d, audit possible extra copies %d (by cause %v), delivered twice on record %d, whole test %s",
		wantReports, dups, rep.PossibleExtraCopies, rep.DoubtfulPostsByCause, rep.DeliveredTwice, since(testStart))
}

// clusterNet is the cluster test's own network (testkit/netns): a
// namespace holding node 3, reached from the host through a veth pair; the
// other nodes listen on the host end's address. Partitioning node 3 drops
// every packet in the namespace (nftables, policy drop), silently: no RST,
// no ICMP.
type clusterNet struct{ *netns.Namespace }

// setupClusterNet creates the namespace and the veth pair, removed when the
// test ends, or says why it cannot (not root, no ip or nft, no namespaces
// here).
func setupClusterNet(t *testing.T) (*clusterNet, string) {
	t.Helper()
	n, why := netns.Setup(netns.Spec{Prefix: "ppkc", Subnet: 231, Table: "ppkc_partition", Node: 3})
	if n == nil {
		return nil, why
	}
	t.Cleanup(n.Close) // after the cluster's nodes are killed (cleanups run last-in first-out)
	return &clusterNet{n}, ""
}

// cut drops every packet in and out of the namespace; heal lifts it.
func (n *clusterNet) cut(t *testing.T) {
	t.Helper()
	if err := n.Cut(); err != nil {
		t.Fatal(err)
	}
}

func (n *clusterNet) heal(t *testing.T) {
	t.Helper()
	if err := n.Heal(); err != nil {
		t.Error(err)
	}
}
