package replay

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/playpipe/playpipe/testkit/testenv"
)

// TestReadRangesSilenceIsNotTheEnd: a read whose ranges go past the last
// record ends at the end offset the broker listed when it began; with the
// broker frozen (every request held) before the read got there, the same
// read ends with a *KafkaTimeoutError, not as if the ranges were done; and
// a range whose last offsets hold an aborted transaction and its marker
// ends on the marker, not on a silence.
func TestReadRangesSilenceIsNotTheEnd(t *testing.T) {
	for _, c := range []string{"answering", "frozen", "aborted tail"} {
		t.Run(c, func(t *testing.T) {
			frozen := c == "frozen"
			k := testenv.StartKafka(t, 1)
			topic := k.Config.Topics().Reports
			cl := k.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			pad := make([]byte, 600)
			for i := range 10 {
				if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: append([]byte(strconv.Itoa(i)), pad...)}).FirstErr(); err != nil {
					t.Fatal(err)
				}
			}
			if c == "aborted tail" {
				txn := k.Client(t, kgo.TransactionalID("readranges-test"))
				if err := txn.BeginTransaction(); err != nil {
					t.Fatal(err)
				}
				for range 3 {
					if err := txn.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte("aborted")}).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
				if err := txn.EndTransaction(ctx, kgo.TryAbort); err != nil {
					t.Fatal(err)
				}
			}
			// Frozen: kfake runs requests one at a time, so a control
			// function that blocks holds every request, as SIGSTOP would.
			release := make(chan struct{})
			var once sync.Once
			t.Cleanup(func() { once.Do(func() { close(release) }) }) // before the broker's own cleanup
			// The cluster is taken once: the control function still runs
			// for the requests of the broker's own close, after the
			// Embedded has let go of it.
			kc := k.Cluster()
			freeze := func() {
				kc.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
					kc.KeepControl()
					<-release
					return nil, nil, false
				})
			}
			opts, err := k.Config.ClientOpts()
			if err != nil {
				t.Fatal(err)
			}
			// Frozen: small fetches, a record or two each, so that the
			// freeze comes before the read has the rest. (Not with the
			// aborted tail: kfake then hands out the aborted records of a
			// transaction a fetch starts in the middle of.)
			if frozen {
				opts = append(opts, kgo.FetchMaxPartitionBytes(700), kgo.FetchMaxBytes(700))
			}
			w := waits{timeout: 2 * time.Second, brokers: k.Config.Brokers}
			var read int
			start := time.Now()
			var frozeAt time.Time
			err = readRanges(ctx, w, opts, topic, map[int32][2]int64{0: {0, 20}}, func(r *kgo.Record) error {
				if read++; read == 5 && frozen {
					freeze()
					frozeAt = time.Now()
				}
				return nil
			})
			took := time.Since(start)
			t.Logf("read %d records, returned after %s: %v", read, took.Round(time.Millisecond), err)
			if !frozen {
				if read != 10 || err != nil {
					t.Errorf("with the broker answering: %d records, %v; want 10, the end of the ranges (nil)", read, err)
				}
				return
			}
			var ke *KafkaTimeoutError
			if !errors.As(err, &ke) {
				t.Fatalf("with the broker frozen: %v, want a *KafkaTimeoutError", err)
			}
			if read >= 10 {
				t.Errorf("read all %d records although frozen after the fifth: the test's fetches are too large", read)
			}
			// One timeout after the last record, a poll (1 s), the
			// reader's bounded close (2 × 1 s) and 2 s of slack.
			if d := time.Since(frozeAt); d > w.timeout+time.Second+4*time.Second {
				t.Errorf("the frozen read ended %s after the freeze, want within timeout + 1 s + 4 s", d.Round(time.Millisecond))
			}
		})
	}
}
