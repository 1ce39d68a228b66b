//go:build docker

package docker_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ClickHouse/clickhouse-go/v2"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/partnerapi"
	"github.com/playpipe/playpipe/partnerapi/sandbox"
	"github.com/playpipe/playpipe/producer/simulator"
	"github.com/playpipe/playpipe/testkit/expect"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// play is the identity of one posted report, as the sandbox decoded it.
type play = expect.Play

// TestPipelineOnContainers: the roles as processes on Apache Kafka and a
// current ClickHouse, through a 500 storm, a sink restart, a standby window,
// a ClickHouse restart and a broker restart; at the end the audit equals the
// sandbox's ledger and the independently expected plays.
func TestPipelineOnContainers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()

	kc := startKafka(ctx, t)
	ch := startClickHouse(ctx, t)
	sb := testenv.StartSandbox(t, func(o *sandbox.Config) { o.Seed, o.Pages, o.ListsPerPage, o.MixesPerList = 11, 2, 2, 5 })
	bin := buildPlaypipe(t)
	t.Logf("kafka %s (%s), clickhouse %s (%s), sandbox %s",
		kc.Broker, composeImage(t, "apache/kafka:"), ch.Addr, composeImage(t, "clickhouse/clickhouse-server:"), sb.URL)

	kcfg := kafkax.Config{Brokers: []string{kc.Broker}, TopicPrefix: kafkax.DefaultTopicPrefix, Partitions: 3, ReplicationFactor: -1}
	common := []string{
		"PLAYPIPE_BROKERS=" + kc.Broker,
		"PLAYPIPE_TOPIC_PREFIX=" + kcfg.TopicPrefix,
		"PLAYPIPE_LOG_FORMAT=json",
		"PLAYPIPE_LOG_LEVEL=info",
		"PLAYPIPE_SESSION_TIMEOUT=6s",
	}
	api := []string{
		"PLAYPIPE_API_URL=" + sb.URL,
		"PLAYPIPE_API_CLIENT_ID=" + sb.ClientID,
		"PLAYPIPE_API_CLIENT_SIGNATURE=" + sb.ClientSignature,
	}
	clickhouseEnv := []string{
		"PLAYPIPE_CLICKHOUSE_ADDR=" + ch.Addr,
		"PLAYPIPE_CLICKHOUSE_DATABASE=" + ch.Database,
		"PLAYPIPE_CLICKHOUSE_USER=" + ch.User,
		"PLAYPIPE_CLICKHOUSE_PASSWORD=" + ch.Password,
	}
	env := func(parts ...[]string) []string {
		var out []string
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}
	consume := startRole(ctx, t, bin, "consume", env(common, api, []string{"PLAYPIPE_INSTANCE_ID=consume-0", "PLAYPIPE_TRANSACTIONAL_ID=e2e-enrich-0"}),
		"--partitions", "3")
	report := startRole(ctx, t, bin, "report", env(common, api, []string{"PLAYPIPE_INSTANCE_ID=report-0"}),
		"--partitions", "3", "--concurrency", "16", "--standby-probe-interval", "100ms", "--backoff-max", "300ms")
	sink := startRole(ctx, t, bin, "sink", env(common, clickhouseEnv, []string{"PLAYPIPE_INSTANCE_ID=sink-0"}),
		"--partitions", "3", "--batch-rows", "2000", "--linger", "200ms", "--retry-max", "500ms")
	roles := []*roleProc{consume, report, sink}

	client, err := partnerapi.New(partnerapi.Config{BaseURL: sb.URL, Logger: testenv.Logger(t),
		Credentials: partnerapi.Credentials{ClientID: sb.ClientID, ClientSignature: sb.ClientSignature, Email: sb.Email}})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	mixes, err := simulator.CatalogFromAPI(ctx, client, 0)
	if err != nil {
		t.Fatal(err)
	}
	sim := simulator.Config{Kafka: kcfg, Mixes: mixes, Events: 3000, Rate: 1500, Devices: 60, BadShare: 0.08, Seed: 5}
	gen, err := simulator.NewGenerator(sim)
	if err != nil {
		t.Fatal(err)
	}
	var msgs []simulator.Message
	for m, ok := gen.Next(); ok; m, ok = gen.Next() {
		msgs = append(msgs, m)
	}
	want, wantBelow, validEvents, badEvents, err := expect.Sim(sb.Catalog(), msgs)
	if err != nil {
		t.Fatal(err)
	}
	wantReports := 0
	for _, n := range want {
		wantReports += n
	}
	t.Logf("simulation: %d events (%d valid, %d bad) → %d reports to post, %d below the minimum", len(msgs), validEvents, badEvents, wantReports, wantBelow)

	simDone := make(chan error, 1)
	go func() {
		st, err := simulator.Run(ctx, sim)
		if err == nil && st.Sent != len(msgs) {
			err = fmt.Errorf("simulator sent %d of %d", st.Sent, len(msgs))
		}
		simDone <- err
	}()

	step := func(d time.Duration, what string, f func()) {
		time.Sleep(d)
		if err := anyExited(roles...); err != nil {
			t.Fatal(err)
		}
		t.Log(what)
		f()
	}
	step(400*time.Millisecond, "500 storm: 30% of play reports", func() {
		sb.SetFaults(sandbox.Faults{Report: sandbox.GroupFaults{Rate500: 0.3}})
	})
	step(time.Second, "sink stopped", func() { sink.stop() })
	step(200*time.Millisecond, "storm over; standby window opens", func() {
		sb.SetFaults(sandbox.Faults{})
		sb.SetMode(sandbox.ModeStandby)
	})
	step(300*time.Millisecond, "sink restarted; ClickHouse stopped for 3 s", func() {
		sink.start(ctx)
		restart(ctx, t, ch, "ClickHouse", 3*time.Second)
	})
	step(1200*time.Millisecond, "standby window closes", func() { sb.SetMode(sandbox.ModeLive) })
	if err := <-simDone; err != nil {
		t.Fatal(err)
	}
	step(0, "broker restart (stopped for 5 s)", func() { restart(ctx, t, kc, "Kafka", 5*time.Second) })

	// Wait for the ledger to settle: everything delivered and audited.
	conn, err := clickhouse.Open(&clickhouse.Options{Addr: []string{ch.Addr},
		Auth: clickhouse.Auth{Database: ch.Database, Username: ch.User, Password: ch.Password}})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	var version string
	if err := conn.QueryRow(ctx, "SELECT version()").Scan(&version); err == nil {
		t.Logf("ClickHouse server %s", version)
	}
	// The sink migrated the ledger on this server, in the current-server
	// schema (LowCardinality columns; analytics.Schema).
	applied, err := analytics.AppliedVersions(ctx, conn, ch.Database)
	if err != nil || len(applied) == 0 || applied[len(applied)-1] != analytics.LatestVersion() {
		t.Fatalf("migrations on ClickHouse %s: applied %v (err %v), want up to %d", version, applied, err, analytics.LatestVersion())
	}
	if s := analytics.SchemaForVersion(version); s != analytics.SchemaCurrent {
		t.Fatalf("ClickHouse %s gets the %s schema, want current", version, s)
	}
	auditor, err := analytics.NewAuditor(conn, ch.Database)
	if err != nil {
		t.Fatal(err)
	}
	window := analytics.AuditOptions{From: time.Now().Add(-time.Hour), To: time.Now().Add(time.Hour)}
	var rep *analytics.Audit
	deadline := time.Now().Add(4 * time.Minute)
	for {
		if err := anyExited(roles...); err != nil {
			t.Fatal(err)
		}
		rep, err = auditor.Audit(ctx, window)
		if err == nil && rep.EventsReceived == uint64(len(msgs)) && rep.PlaysDerived == uint64(wantReports+wantBelow) &&
			rep.Pending == 0 && rep.Delivered == uint64(wantReports) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pipeline did not settle: audit %+v (err %v), sandbox %+v", rep, err, sb.Counts())
		}
		time.Sleep(time.Second)
	}

	// The sandbox's ledger: exactly the expected reports, each once.
	led := sb.Ledger()
	got := map[play]int{}
	for _, e := range led.Accepted {
		r := e.Report
		got[expect.Of(r)]++
	}
	if led.Duplicates != 0 {
		t.Errorf("sandbox counted %d duplicate reports", led.Duplicates)
	}
	if missing, extra := expect.Diff(want, got); len(missing)+len(extra) > 0 {
		t.Errorf("delivered reports differ from the expected plays: %d missing (e.g. %v), %d unexpected (e.g. %v)", len(missing), expect.First(missing), len(extra), expect.First(extra))
	}
	if led.StandbyCount == 0 {
		t.Errorf("the standby window answered no report: the test did not exercise replay")
	}
	checks := []struct {
		name      string
		got, want uint64
	}{
		{"events received", rep.EventsReceived, uint64(len(msgs))},
		{"events rejected", rep.EventsRejected, uint64(badEvents)},
		{"plays derived", rep.PlaysDerived, uint64(wantReports + wantBelow)},
		{"plays below minimum", rep.PlaysBelowMinimum, uint64(wantBelow)},
		{"delivered", rep.Delivered, uint64(wantReports)},
		{"delivered (sandbox ledger)", rep.Delivered, uint64(led.AcceptedCount)},
		{"delivered more than once", rep.DeliveredTwice, 0},
		{"pending", rep.Pending, 0},
		{"rejected by the API", rep.RejectedByAPI, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("audit %s = %d, want %d", c.name, c.got, c.want)
		}
	}
	if rep.StandbyAnswered == 0 || rep.StandbyThenDelivered != rep.StandbyAnswered {
		t.Errorf("audit standby answered %d, then delivered %d: want equal and > 0", rep.StandbyAnswered, rep.StandbyThenDelivered)
	}
	if problems := rep.Problems(); len(problems) > 0 {
		t.Errorf("audit reports problems: %v", problems)
	}
	t.Logf("audit: %d events, %d rejected, %d plays, %d delivered, %d standby-then-delivered; sandbox accepted %d, standby %d",
		rep.EventsReceived, rep.EventsRejected, rep.PlaysDerived, rep.Delivered, rep.StandbyThenDelivered, led.AcceptedCount, led.StandbyCount)

	// The same ledger in the portable schema gives the same audit and lists:
	// the sink is stopped (nothing more arrives), its rows are copied into a
	// ledger made by the portable DDL on this server, and both are audited.
	sink.stop()
	portableDB := ch.Database + "_portable"
	copyLedger(ctx, t, conn, ch.Database, portableDB)
	assertCurrentSchema(ctx, t, conn, ch.Database, portableDB)
	same := assertSameAudit(ctx, t, conn, ch.Database, portableDB, window)
	if same.Delivered != rep.Delivered || same.StandbyAnswered != rep.StandbyAnswered {
		t.Errorf("audit after the copy: delivered %d, standby %d; before: %d, %d", same.Delivered, same.StandbyAnswered, rep.Delivered, rep.StandbyAnswered)
	}
}
