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

	"github.com/playpipe/playpipe/wiring/testenv"
)

// TestReadRangesSilenceIsNotTheEnd: a read whose ranges go past the last
// record ends once the broker has answered and still nothing came; with
// the broker frozen (every request held) after the last record, the same
// read ends with a *KafkaTimeoutError, not as if the ranges were done.
func TestReadRangesSilenceIsNotTheEnd(t *testing.T) {
	for _, frozen := range []bool{false, true} {
		t.Run("frozen="+strconv.FormatBool(frozen), func(t *testing.T) {
			k := testenv.StartKafka(t, 1)
			topic := k.Config.Topics().Reports
			cl := k.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			for i := range 10 {
				if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Partition: 0, Value: []byte(strconv.Itoa(i))}).FirstErr(); err != nil {
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
			c := k.Cluster()
			freeze := func() {
				c.Control(func(kmsg.Request) (kmsg.Response, error, bool) {
					c.KeepControl()
					<-release
					return nil, nil, false
				})
			}
			opts, err := k.Config.ClientOpts()
			if err != nil {
				t.Fatal(err)
			}
			w := waits{timeout: 2 * time.Second, brokers: k.Config.Brokers, idle: 300 * time.Millisecond}
			var read int
			start := time.Now()
			var frozeAt time.Time
			err = readRanges(ctx, w, opts, topic, map[int32][2]int64{0: {0, 12}}, func(r *kgo.Record) error {
				if read++; read == 10 && frozen {
					freeze()
					frozeAt = time.Now()
				}
				return nil
			})
			took := time.Since(start)
			t.Logf("read %d records, returned after %s: %v", read, took.Round(time.Millisecond), err)
			if read != 10 {
				t.Errorf("read %d records, want 10", read)
			}
			if !frozen {
				if err != nil {
					t.Errorf("with the broker answering: %v, want the end of the ranges (nil)", err)
				}
				return
			}
			var ke *KafkaTimeoutError
			if !errors.As(err, &ke) {
				t.Fatalf("with the broker frozen: %v, want a *KafkaTimeoutError", err)
			}
			// The read's silence (idle, polled each second), one timeout,
			// the reader's bounded close (2 × 1 s) and 2 s of slack.
			if d := time.Since(frozeAt); d > w.idle+time.Second+w.timeout+4*time.Second {
				t.Errorf("the frozen read ended %s after the freeze, want within idle + 1 s + timeout + 4 s", d.Round(time.Millisecond))
			}
		})
	}
}
