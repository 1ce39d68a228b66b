package consumer

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestEnricherNewSessionAfterCoordinatorFault: the transaction coordinator
// answers EndTxn with COORDINATOR_NOT_AVAILABLE for 3 s, longer than the
// client retries it, so a transaction's End fails (as at a coordinator's
// kill -9 on Apache Kafka). The enricher makes a new Kafka session in
// place: Run does not return, and every event is derived exactly once.
// Before, Run returned "end transaction" and the consume role exited 1
// (CI: TestKafkaClusterFaults, two brokers down).
func TestEnricherNewSessionAfterCoordinatorFault(t *testing.T) {
	t.Parallel()
	k := testenv.StartKafka(t, 3)
	mixes := fakeMixes()
	evs := genEvents(3, 3000, refMixes(mixes), 999_999)
	publish(t, k, k.Config.Topics().Events, evs)

	fault := refuseEndTxn(k)
	e := newTestEnricher(t, k, newFakeSource(mixes...), sessionFaultConfig)
	fault.armAfter500(e, nil)
	stop := runEnricher(t, e)
	waitFor(t, 60*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(evs)) })
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if fault.refused.Load() == 0 {
		t.Fatal("no EndTxn refused: the test proves nothing")
	}
	st := e.Stats()
	if st.Events != int64(len(evs)) {
		t.Errorf("committed %d events, want %d", st.Events, len(evs))
	}
	if st.Aborts == 0 {
		t.Errorf("no transaction counted aborted: %+v", st)
	}
	t.Logf("EndTxn refused %d times; stats %+v", fault.refused.Load(), st)
	checkOutput(t, k, evs)
}

// TestEnricherNewSessionRemovesOldMember: as above, a transaction's End
// fails and the enricher makes a new Kafka session, but the old session's
// own LeaveGroup never reaches the coordinator (dropped, as when the
// coordinator is frozen or cut off while the old client leaves). The new
// session removes the old member itself, so its join does not wait for the
// old member's session timeout (30 s here): every event is committed well
// within it. Before, the old member stayed until its session timeout and the
// new session's rebalance waited for it.
func TestEnricherNewSessionRemovesOldMember(t *testing.T) {
	t.Parallel()
	const sessionTimeout = 30 * time.Second
	k := testenv.StartKafka(t, 3)
	mixes := fakeMixes()
	evs := genEvents(5, 3000, refMixes(mixes), 999_999)
	publish(t, k, k.Config.Topics().Events, evs)

	fault := refuseEndTxn(k)
	var oldMember atomic.Value // string: the group member of the session that fails
	oldMember.Store("")
	var dropped, removed atomic.Int64
	kc := k.Cluster()
	kc.ControlKey(int16(kmsg.LeaveGroup), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		req := kr.(*kmsg.LeaveGroupRequest)
		old := oldMember.Load().(string)
		for _, m := range req.Members {
			if old == "" || m.MemberID != old {
				continue
			}
			if m.Reason == nil || *m.Reason != leaveReason {
				dropped.Add(1) // the old client's own leave: lost
				return nil, errors.New("leave dropped by the test"), true
			}
			removed.Add(1)
		}
		return nil, nil, false
	})
	e := newTestEnricher(t, k, newFakeSource(mixes...), func(o *Config) {
		sessionFaultConfig(o)
		o.Kafka.SessionTimeout = sessionTimeout
	})
	var armedAt atomic.Int64
	fault.armAfter500(e, func(cl *kgo.Client) {
		member, _ := cl.GroupMetadata()
		oldMember.Store(member)
		armedAt.Store(time.Now().UnixNano())
	})
	stop := runEnricher(t, e)
	waitFor(t, 90*time.Second, "all events committed", func() bool { return e.Stats().Events >= int64(len(evs)) })
	took := time.Since(time.Unix(0, armedAt.Load()))
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if dropped.Load() == 0 {
		t.Fatal("the old session's own leave was never dropped: the test proves nothing")
	}
	t.Logf("old member %s: %d of its own leaves dropped, removed by the new session %d times; all events committed %s after the fault began",
		oldMember.Load(), dropped.Load(), removed.Load(), took.Round(time.Millisecond))
	if took >= sessionTimeout/2 {
		t.Errorf("all events committed %s after the fault began: the new session waited for the old member's session timeout (%s)", took.Round(time.Millisecond), sessionTimeout)
	}
	if removed.Load() == 0 {
		t.Errorf("the new session did not remove the old session's member %s", oldMember.Load())
	}
	checkOutput(t, k, evs)
}

// endTxnFault answers EndTxn with COORDINATOR_NOT_AVAILABLE while refusing.
type endTxnFault struct {
	refusing atomic.Bool
	refused  atomic.Int64
}

func refuseEndTxn(k *testenv.Kafka) *endTxnFault {
	f := &endTxnFault{}
	kc := k.Cluster()
	kc.ControlKey(int16(kmsg.EndTxn), func(kr kmsg.Request) (kmsg.Response, error, bool) {
		kc.KeepControl()
		if !f.refusing.Load() {
			return nil, nil, false
		}
		resp := kr.(*kmsg.EndTxnRequest).ResponseKind().(*kmsg.EndTxnResponse)
		resp.ErrorCode = kerr.CoordinatorNotAvailable.Code
		f.refused.Add(1)
		return resp, nil, true
	})
	return f
}

// armAfter500 makes f refuse for 3 s, once, from the first batch after e
// committed 500 events; armed (when not nil) is called then with the
// session's client.
func (f *endTxnFault) armAfter500(e *Enricher, armed func(*kgo.Client)) {
	var once atomic.Bool
	e.testHookProduced = func(cl *kgo.Client) {
		if e.Stats().Events >= 500 && once.CompareAndSwap(false, true) {
			if armed != nil {
				armed(cl)
			}
			f.refusing.Store(true)
			time.AfterFunc(3*time.Second, func() { f.refusing.Store(false) })
		}
	}
}

// sessionFaultConfig: transactions of 100 records, and EndTxn retried for
// 1 s only, so that a refusal of 3 s fails a transaction's End.
func sessionFaultConfig(o *Config) {
	o.TxnRecords = 100
	o.TransactionTimeout, o.MaxTxnWait = 10*time.Second, 5*time.Second
	o.KafkaOpts = []kgo.Opt{kgo.RetryTimeoutFn(func(key int16) time.Duration {
		if key == int16(kmsg.EndTxn) {
			return time.Second
		}
		return 30 * time.Second
	})}
}

// TestRetrySession: only errors of the Kafka session are worth a new
// session, and not fencing or a refusal for lack of rights.
func TestRetrySession(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{inSession(fmt.Errorf("consumer: end transaction: %w", kerr.CoordinatorNotAvailable)), true},
		{inSession(fmt.Errorf("consumer: claim transactional id: %w", errors.New("unable to dial: connection refused"))), true},
		{inSession(fmt.Errorf("consumer: end transaction: %w", kerr.ProducerFenced)), false},
		{inSession(fmt.Errorf("consumer: end transaction: %w", kerr.InvalidProducerEpoch)), false},
		{inSession(fmt.Errorf("consumer: claim: %w", kerr.TransactionalIDAuthorizationFailed)), false},
		{fmt.Errorf("consumer: kafka session: %w", kerr.CoordinatorNotAvailable), false}, // not marked: not the session's
		{errors.New("consumer: partner API edge blocks us"), false},
		{nil, false},
	} {
		if got := retrySession(c.err); got != c.want {
			t.Errorf("retrySession(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if inSession(nil) != nil {
		t.Error("inSession(nil) is not nil")
	}
}
