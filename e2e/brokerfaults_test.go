//go:build linux

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/playpipe/playpipe/analytics"
	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestBrokerFrozen: the broker is frozen with
// SIGSTOP for longer than the gateway's --delivery-timeout while two fleets
// post. Each POST must be answered within the delivery timeout (+1 s) with
// 503, Retry-After and a per-event fate; /readyz of every role must answer
// within a second and name the broker; after SIGCONT every event answered
// accepted is on plays.events exactly once, none answered failed is there,
// the ones answered unknown are counted, and once the fleet retried those
// every play reaches the partner.
func TestBrokerFrozen(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 5 processes")
	}
	r := startBrokerRig(t)
	first := r.deliverFirst(t, "before the freeze")

	logFrom := r.logSizes()
	r.brokerP.Signal(t, syscall.SIGSTOP)
	frozeAt := time.Now()
	t.Logf("broker (pid %d) frozen", r.brokerP.Cmd.Process.Pid)
	defer func() {
		if r.brokerP.Running() {
			r.brokerP.Signal(t, syscall.SIGCONT)
		}
	}()

	// Two fleets post while the broker is frozen.
	batches := map[string][]simRecord{"fleet-a": r.take(10), "fleet-b": r.take(10)}
	answers := map[string]answer{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for fleet, evs := range batches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := r.post(fleet, evs, deliveryTimeout+20*time.Second)
			mu.Lock()
			answers[fleet] = a
			mu.Unlock()
		}()
	}
	// /readyz of every role, polled while the fleets wait: each answer
	// within a second, and 503 naming the broker within a few probes.
	var maxReady time.Duration
	named := map[string]string{}
	for time.Since(frozeAt) < deliveryTimeout+2*time.Second || len(named) < len(r.roles) {
		if time.Since(frozeAt) > 20*time.Second {
			t.Fatalf("/readyz did not name the frozen broker within 20 s for every role: %v", named)
		}
		for name, ro := range r.roles {
			st, body, took, err := readyz(ro.admin)
			maxReady = max(maxReady, took)
			if err != nil || took > time.Second {
				t.Errorf("%s /readyz while the broker is frozen: %v after %s (want an answer within 1 s)", name, err, took.Round(time.Millisecond))
				continue
			}
			if st == http.StatusServiceUnavailable && strings.Contains(body, r.broker) && named[name] == "" {
				named[name] = fmt.Sprintf("after %s: %s", time.Since(frozeAt).Round(time.Millisecond), strings.TrimSpace(body))
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	wg.Wait()
	for name, s := range named {
		t.Logf("%s /readyz 503 %s", name, s)
	}
	t.Logf("slowest /readyz answer while frozen: %s", maxReady.Round(time.Millisecond))

	fate := map[string]string{} // event_id → status
	unknown := 0
	for fleet, a := range answers {
		t.Logf("%s: %d after %s, Retry-After %q, accepted %d failed %d unknown %d, code %q", fleet, a.status, a.took.Round(time.Millisecond),
			a.retryAfter, a.body.Accepted, a.body.Failed, a.body.Unknown, a.body.Code)
		if a.err != nil {
			t.Fatalf("%s: no answer: %v after %s", fleet, a.err, a.took)
		}
		if a.took > deliveryTimeout+time.Second {
			t.Errorf("%s answered after %s, want within the delivery timeout %s (+1 s)", fleet, a.took, deliveryTimeout)
		}
		if a.status != http.StatusServiceUnavailable || a.retryAfter == "" || a.body.Code != "kafka_timeout" {
			t.Errorf("%s: answer %d Retry-After %q code %q, want 503 with Retry-After and code kafka_timeout", fleet, a.status, a.retryAfter, a.body.Code)
		}
		if len(a.body.Events) != len(batches[fleet]) {
			t.Fatalf("%s: %d per-event answers for %d events", fleet, len(a.body.Events), len(batches[fleet]))
		}
		for i, e := range a.body.Events {
			if e.EventID != batches[fleet][i].Key {
				t.Errorf("%s event %d: answer for %q, want %q", fleet, i, e.EventID, batches[fleet][i].Key)
			}
			fate[e.EventID] = string(e.Status)
			switch e.Status {
			case "unknown":
				unknown++
				if !strings.Contains(e.Error, "event_id") {
					t.Errorf("%s event %d: unknown without retry advice: %q", fleet, i, e.Error)
				}
			case "failed":
			default:
				t.Errorf("%s event %d: status %q while the broker is frozen", fleet, i, e.Status)
			}
		}
	}
	// Whether an event is unknown (its request reached the frozen socket)
	// or failed (the producer had to dial anew and never sent it) depends
	// on the connection's state at the freeze; both are right, and Kafka's
	// truth is checked below. None may be accepted.
	t.Logf("while frozen: %d unknown, %d failed", unknown, len(fate)-unknown)
	if d := time.Since(frozeAt); d < frozenFor {
		time.Sleep(frozenFor - d) // frozen well past the delivery timeout
	}
	r.brokerP.Signal(t, syscall.SIGCONT)
	frozen := time.Since(frozeAt)
	t.Logf("broker resumed after %s frozen", frozen.Round(time.Millisecond))
	for name, ro := range r.roles {
		testenv.WaitReady(t, ro.p, ro.admin, 30*time.Second)
		if !ro.p.Running() {
			t.Errorf("%s exited: %v", name, ro.p.Err)
		}
	}

	// Kafka's truth: accepted once, failed never, unknown 0 or 1 times.
	time.Sleep(deliveryTimeout) // records of unknown fate the producer still held are written or failed by now
	copies := r.eventCopies()
	landed := 0
	for id, st := range fate {
		n := copies[id]
		switch {
		case st == "accepted" && n != 1:
			t.Errorf("event %s answered accepted is on plays.events %d times", id, n)
		case st == "failed" && n != 0:
			t.Errorf("event %s answered failed is on plays.events %d times", id, n)
		case st == "unknown" && n > 1:
			t.Errorf("event %s answered unknown is on plays.events %d times", id, n)
		case st == "unknown" && n == 1:
			landed++
		}
	}
	t.Logf("events answered unknown: %d, of which %d reached plays.events after the broker resumed", unknown, landed)

	// The fleets retry every event not accepted (as the answer advises).
	var all []simRecord
	for fleet, evs := range batches {
		all = append(all, evs...)
		var retry []simRecord
		for _, e := range evs {
			if fate[e.Key] != "accepted" {
				retry = append(retry, e)
			}
		}
		if len(retry) == 0 {
			continue
		}
		if a := r.post(fleet, retry, 30*time.Second); a.err != nil || a.status != http.StatusAccepted {
			t.Fatalf("%s retry after the resume: %d %v %+v", fleet, a.status, a.err, a.body)
		}
	}
	after := r.take(10)
	if a := r.post("fleet-a", after, 30*time.Second); a.err != nil || a.status != http.StatusAccepted {
		t.Fatalf("after the resume: %d %v", a.status, a.err)
	}
	all = append(append(all, first...), after...)
	want := r.wantPlays(all)
	took := r.waitDelivered(want, 90*time.Second)
	time.Sleep(2 * time.Second) // let late copies arrive before counting duplicates
	missing, dups, unexpected := compare(want, r.partnerPlays())
	t.Logf("after the resume: %d plays expected, all at the partner %s after the last post; %d duplicates, %d unexpected, %d missing",
		len(want), took.Round(time.Millisecond), dups, len(unexpected), len(missing))
	if len(missing) > 0 || len(unexpected) > 0 {
		t.Errorf("partner: %d missing, %d unexpected", len(missing), len(unexpected))
	}
	if dups > 0 {
		t.Errorf("partner holds %d duplicate plays: the retried events of unknown fate were posted twice", dups)
	}
	for name, ro := range r.roles {
		lines := logLines(t, ro.p.Log, logFrom[name])
		t.Logf("%s: %d log lines about the broker over the %s freeze and its aftermath:\n%s", name, len(lines), frozen.Round(time.Second), strings.Join(lines, "\n"))
		if len(lines) > 12 {
			t.Errorf("%s wrote %d lines about the frozen broker, want a few:\n%s", name, len(lines), strings.Join(lines[:12], "\n"))
		}
	}
}

// TestBrokerRestartedEmpty: the broker is killed
// and started again, empty, on the same port while every role runs. Every
// /readyz must say 503 naming the broker while it is down; the roles must
// then notice the new topics (new ids) and exit 75 at once for their
// supervisor (this test's loop) to restart them; events the gateway answers
// 202 after the restart must all reach the partner without a hand restart;
// and no role may write more than a few lines about the fault.
func TestBrokerRestartedEmpty(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 5 processes")
	}
	r := startBrokerRig(t)
	first := r.deliverFirst(t, "before the restart")
	r.inLedger(t, first)
	logFrom := r.logSizes()
	sup := superviseRoles(r)

	r.brokerP.Signal(t, syscall.SIGKILL)
	r.brokerP.Wait(t, 10*time.Second)
	killedAt := time.Now()
	t.Logf("broker killed")
	r.waitReadyzNames(t, killedAt, r.broker, "the dead broker", "while the broker is down")
	for name, ro := range r.roles { // the metrics say it too
		up, err1 := testenv.ScrapeSum(ro.admin, "playpipe_kafka_broker_up")
		faults, err2 := testenv.ScrapeSum(ro.admin, "playpipe_kafka_faults_total", `kind="unreachable"`)
		t.Logf("%s while the broker is down: playpipe_kafka_broker_up %v, playpipe_kafka_faults_total{kind=\"unreachable\"} %v", name, up, faults)
		if err1 != nil || err2 != nil || up != 0 || faults < 1 {
			t.Errorf("%s metrics while the broker is down: broker_up %v (%v), unreachable faults %v (%v); want 0 and ≥ 1", name, up, err1, faults, err2)
		}
	}
	if d := time.Since(killedAt); d < downFor {
		time.Sleep(downFor - d) // down a while: a probe fails every second
	}
	r.startBroker()
	restartedAt := time.Now()
	t.Logf("broker started again, empty, on %s after %s down", r.broker, restartedAt.Sub(killedAt).Round(time.Millisecond))

	// A fleet posts after the restart, retrying (as advised) until each
	// batch is answered 202.
	acked := r.postUntilAccepted(t, 3, "the broker restart")
	took := r.waitDelivered(r.wantPlays(acked), 120*time.Second)
	recovered := time.Since(restartedAt)
	t.Logf("every play of the %d events answered 202 after the restart is at the partner %s after the broker restart (%s after the last 202)",
		len(acked), recovered.Round(time.Millisecond), took.Round(time.Millisecond))
	codes := sup.exitCodes()
	t.Logf("role exits under the supervisor: %v", codes)
	for _, name := range []string{"consume", "report", "sink", "ingest"} {
		c := codes[name]
		if len(c) == 0 || len(c) > 3 {
			t.Errorf("%s: exit codes %v, want one exit (75: the broker came back different), a few at most", name, c)
		}
		for _, code := range c {
			if code != 75 && code != 1 {
				t.Errorf("%s: exit codes %v, want 75 (or 1 for a start that found no broker)", name, c)
			}
		}
	}
	for name := range r.roles {
		logPath := filepath.Join(r.dir, name+".log")
		lines := logLines(t, logPath, logFrom[name])
		per := float64(len(lines)) / time.Since(killedAt).Minutes()
		t.Logf("%s: %d log lines about the broker in %s (%.0f a minute), restarts included:\n%s", name, len(lines), time.Since(killedAt).Round(time.Second), per, strings.Join(lines, "\n"))
		if len(lines) > 15 {
			t.Errorf("%s wrote %d lines about the restarted broker, want a few:\n%s", name, len(lines), strings.Join(lines[:15], "\n"))
		}
		if n := len(testenv.GrepLog(logPath, "UNKNOWN_TOPIC_ID")); n > 3 {
			t.Errorf("%s logged UNKNOWN_TOPIC_ID %d times", name, n)
		}
	}
	for name, ro := range r.roles {
		testenv.WaitReady(t, sup.proc(name), ro.admin, 30*time.Second)
		if up, err := testenv.ScrapeSum(ro.admin, "playpipe_kafka_broker_up"); err != nil || up != 1 {
			t.Errorf("%s after the recovery: playpipe_kafka_broker_up %v (%v), want 1", name, up, err)
		}
	}

	// The ledger holds both lives of the topics at the same positions (issue
	// 30, 7.1): the audit counts every event once and says that the window
	// holds two generations of the events topic, without failing.
	r.checkGenerations(t, uint64(len(first)+len(acked)), "after the restart")
}

// TestBrokerFrozenShutdown stops every role with SIGTERM while the broker is
// frozen: each must exit 0 within its shutdown bound, not wait on the broker
// (leaving the group, committing, flushing and closing clients included).
// Before kafkax.CloseClient, kgo's Close held consume 71 s, report 90 s and
// the sink more than 45 s on the frozen coordinator.
func TestBrokerFrozenShutdown(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 5 processes")
	}
	r := startBrokerRig(t)
	r.deliverFirst(t, "before the freeze")
	r.brokerP.Signal(t, syscall.SIGSTOP)
	defer r.brokerP.Signal(t, syscall.SIGCONT)
	// A request in flight at the freeze, so that the gateway holds unacknowledged records.
	posted, inFlight := make(chan answer, 1), r.take(5)
	go func() { posted <- r.post("fleet-b", inFlight, 30*time.Second) }()
	defer func() { <-posted }()
	time.Sleep(deliveryTimeout / 2)
	start := time.Now()
	for _, ro := range r.roles {
		ro.p.Signal(t, syscall.SIGTERM)
	}
	// Each role's own shutdown bounds (--shutdown-timeout: 10 s for ingest
	// here, the sink's and the reporter's 10 s defaults), a commit the
	// frozen coordinator holds (franz-go lets a commit in flight finish
	// before the next one starts: up to its request timeout, ~10–20 s), and
	// the bounded group leave and client close (2 × kafkax.DefaultLeaveTimeout).
	// Measured: 10–39 s.
	const bound = 60 * time.Second
	for name, ro := range r.roles {
		code := ro.p.Wait(t, bound)
		t.Logf("%s exited %d %s after SIGTERM with the broker frozen", name, code, ro.p.Exited.Sub(start).Round(time.Millisecond))
		if code != 0 {
			t.Errorf("%s exited %d after SIGTERM, want 0 within %s (log %s)", name, code, bound, ro.p.Log)
		}
	}
}

// TestTopicRecreated deletes plays.events on a running Apache Kafka broker
// and creates it again, as an operator may: every /readyz must say the
// topic is missing, then each role must notice the new topic id and exit 75
// for its supervisor; the events the gateway answers 202 afterwards must all
// reach the partner (a restarted role finds no committed offsets on the new
// topic: the broker dropped them with the old one, and the roles read a new
// topic from its start), and the ledger's audit counts every event of both
// generations once and names them.
func TestTopicRecreated(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end: builds the binary and runs 5 processes")
	}
	r := startBrokerRigOnApache(t)
	first := r.deliverFirst(t, "before the deletion")
	r.inLedger(t, first)
	r.checkTraffic(t)
	logFrom := r.logSizes()
	sup := superviseRoles(r)
	cl, err := kgo.NewClient(kgo.SeedBrokers(r.broker))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := adm.DeleteTopics(ctx, "plays.events"); err != nil {
		t.Fatalf("delete plays.events: %v", err)
	}
	deletedAt := time.Now()
	r.waitReadyzNames(t, deletedAt, "plays.events", "the missing topic", "with a topic missing")
	// Apache Kafka deletes a topic in the background: a create can be
	// refused (TOPIC_ALREADY_EXISTS) until the deletion is complete.
	for {
		resp, err := adm.CreateTopics(ctx, 3, -1, nil, "plays.events")
		if err == nil {
			err = resp.Error()
		}
		if err == nil {
			break
		}
		if !errors.Is(err, kerr.TopicAlreadyExists) || ctx.Err() != nil {
			t.Fatalf("create plays.events: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	createdAt := time.Now()
	t.Logf("plays.events deleted and created again after %s", createdAt.Sub(deletedAt).Round(time.Millisecond))
	acked := r.postUntilAccepted(t, 3, "the re-creation")
	r.waitDelivered(r.wantPlays(acked), 120*time.Second)
	t.Logf("every play of the %d events answered 202 after the re-creation is at the partner %s after it", len(acked), time.Since(createdAt).Round(time.Millisecond))
	codes := sup.exitCodes()
	t.Logf("role exits under the supervisor: %v", codes)
	for _, name := range []string{"consume", "report", "sink", "ingest"} {
		if c := codes[name]; len(c) == 0 || c[0] != 75 {
			t.Errorf("%s: exit codes %v, want a first exit with 75 (a topic came back with a new id)", name, c)
		}
	}
	for name := range r.roles {
		lines := logLines(t, filepath.Join(r.dir, name+".log"), logFrom[name])
		t.Logf("%s: %d log lines about the fault, restarts included:\n%s", name, len(lines), strings.Join(lines, "\n"))
		if len(lines) > 15 {
			t.Errorf("%s wrote %d lines about the re-created topic, want a few", name, len(lines))
		}
	}
	r.checkGenerations(t, uint64(len(first)+len(acked)), "after the re-creation")
}

// checkTraffic: every role counts its Kafka traffic on its /metrics
// (kafkax.Wire): after the first plays were delivered, the roles that
// write (ingest, consume, report) show produce requests and records
// written, those that read (consume, report, sink) fetch requests and
// records read — within 30 s: the plays at the partner say nothing of the
// sink, whose fetches wait up to 250 ms for their bytes and which may still
// be joining its group on a loaded machine (a CI rehearsal under -race
// scraped its counters at 0 right after the first delivery).
func (r *brokerRig) checkTraffic(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for name, ro := range r.roles {
		for {
			var missing []string
			get := func(metric string, labels ...string) float64 {
				v, err := testenv.ScrapeSum(ro.admin, metric, labels...)
				if err != nil {
					missing = append(missing, fmt.Sprintf("%s: %v", metric, err))
				}
				return v
			}
			if name != "sink" {
				if n, recs := get("playpipe_kafka_requests_total", `api="Produce"`), get("playpipe_kafka_produced_records_total"); n < 1 || recs < 1 {
					missing = append(missing, fmt.Sprintf("%v produce requests, %v records written, want some", n, recs))
				}
			}
			if name != "ingest" {
				if n, recs := get("playpipe_kafka_requests_total", `api="Fetch"`), get("playpipe_kafka_fetched_records_total"); n < 1 || recs < 1 {
					missing = append(missing, fmt.Sprintf("%v fetch requests, %v records read, want some", n, recs))
				}
			}
			if len(missing) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s, 30 s after the first plays were delivered: %s", name, strings.Join(missing, "; "))
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// postUntilAccepted posts n batches of 10 events as fleet-a, one a second,
// each retried (as the gateway advises) until it is answered 202, for at
// most 60 s after what (the fault the fleet is recovering from); it returns
// the events acknowledged.
func (r *brokerRig) postUntilAccepted(t *testing.T, n int, what string) []simRecord {
	t.Helper()
	var acked []simRecord
	for range n {
		evs := r.take(10)
		deadline := time.Now().Add(60 * time.Second)
		for {
			a := r.post("fleet-a", evs, 10*time.Second)
			if a.err == nil && a.status == http.StatusAccepted {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("no 202 within 60 s of posting after %s: last %d %v %+v", what, a.status, a.err, a.body)
			}
			time.Sleep(500 * time.Millisecond) // the fleet's retry pace (scenario)
		}
		acked = append(acked, evs...)
		time.Sleep(time.Second) // one batch a second (scenario)
	}
	return acked
}

// deliverFirst posts 20 events as fleet-a, fails unless they are answered
// 202 (before the fault named by before), and waits until their plays are
// at the partner: every role is up and working before the fault. It
// returns the events.
func (r *brokerRig) deliverFirst(t *testing.T, before string) []simRecord {
	t.Helper()
	first := r.take(20)
	if a := r.post("fleet-a", first, 10*time.Second); a.err != nil || a.status != http.StatusAccepted {
		t.Fatalf("%s: %d %v %+v", before, a.status, a.err, a.body)
	}
	r.waitDelivered(r.wantPlays(first), 60*time.Second)
	return first
}

// logSizes is each role's log size now: where its lines about the fault
// begin.
func (r *brokerRig) logSizes() map[string]int64 {
	from := map[string]int64{}
	for name, ro := range r.roles {
		from[name] = fileSize(r.ps.LogPath(ro.name)) // not ro.p: a supervisor replaces it on a restart
	}
	return from
}

// waitReadyzNames polls every role's /readyz until each has answered 503
// naming needle (the fault, which began at since), at most 15 s; each
// answer must come within a second. fault says what /readyz should
// name, while says when it is asked (for the messages).
func (r *brokerRig) waitReadyzNames(t *testing.T, since time.Time, needle, fault, while string) {
	t.Helper()
	named := map[string]bool{}
	for len(named) < len(r.roles) {
		if time.Since(since) > 15*time.Second {
			t.Fatalf("/readyz did not name %s within 15 s for every role: %v", fault, named)
		}
		for name, ro := range r.roles {
			st, body, took, err := readyz(ro.admin)
			if err != nil || took > time.Second {
				t.Errorf("%s /readyz %s: %v after %s", name, while, err, took)
				continue
			}
			if st == http.StatusServiceUnavailable && strings.Contains(body, needle) && !named[name] {
				named[name] = true
				t.Logf("%s /readyz after %s: 503 %s", name, time.Since(since).Round(time.Millisecond), strings.TrimSpace(body))
			}
		}
		time.Sleep(200 * time.Millisecond) // polls other processes' /readyz
	}
}

// auditWhenReceived runs the audit over the last hour until it counts want
// events received, at most 60 s, and returns its last answer.
func (r *brokerRig) auditWhenReceived(t *testing.T, want uint64) analytics.Audit {
	t.Helper()
	auditArgs := append(append([]string{"audit"}, r.chArgs...), "--from", "-1h", "--to", "+1h", "--format", "json")
	deadline := time.Now().Add(60 * time.Second)
	for {
		rep := runAudit(t, r.ps.Bin, auditArgs)
		if rep.EventsReceived >= want || time.Now().After(deadline) {
			return rep
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// inLedger waits until the sink has written the events of first to the
// ledger: a test that then destroys the broker's data (kills the in-memory
// broker, deletes a topic) would otherwise lose from the ledger the events
// the sink had not read yet — what a broker that forgets its records
// does, not what the test is about. A CI run under -race killed the broker
// 2 s after the 20 plays reached the partner, with the sink still behind.
func (r *brokerRig) inLedger(t *testing.T, first []simRecord) {
	t.Helper()
	if rep := r.auditWhenReceived(t, uint64(len(first))); rep.EventsReceived < uint64(len(first)) {
		t.Fatalf("the ledger holds %d of the %d events delivered before the fault after 60 s", rep.EventsReceived, len(first))
	}
}

// checkGenerations waits (bounded) until the audit counts want events
// received, then requires exactly that, two generations of plays.events
// named, and no problem about generations: each record counted once.
func (r *brokerRig) checkGenerations(t *testing.T, want uint64, what string) {
	t.Helper()
	rep := r.auditWhenReceived(t, want)
	gens := 0
	for _, g := range rep.Generations {
		if g.Topic == "plays.events" {
			gens = len(g.Generations)
		}
	}
	t.Logf("audit %s: %d events received (want %d), generations %+v, problems %q", what, rep.EventsReceived, want, rep.Generations, rep.Problems())
	if rep.EventsReceived != want || gens != 2 {
		t.Errorf("audit: %d events received, %d generations of plays.events; want %d and 2", rep.EventsReceived, gens, want)
	}
	for _, p := range rep.Problems() {
		if strings.Contains(p, "generation") {
			t.Errorf("audit problem: %s", p)
		}
	}
}
