package kafkax

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestEnsureParked: the parked topic is created compacted when missing
// (its partition count returned), and a parked topic that is not
// compacted is refused with ErrParkedNotCompacted.
func TestEnsureParked(t *testing.T) {
	e, err := StartEmbedded("ensure", 3)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, tc := range []struct {
		prefix string
		policy string // of a topic created beforehand; "" none
		ok     bool
	}{{"fresh", "", true}, {"compacted", "compact", true}, {"deleted", "delete", false}, {"both", "compact,delete", false}} {
		c := Config{Brokers: e.Addrs(), TopicPrefix: tc.prefix, Partitions: 4, ReplicationFactor: -1}
		cl, err := kgo.NewClient(kgo.SeedBrokers(e.Addrs()...))
		if err != nil {
			t.Fatal(err)
		}
		adm := kadm.NewClient(cl)
		if tc.policy != "" {
			p := tc.policy
			if _, err := adm.CreateTopic(ctx, 2, -1, map[string]*string{"cleanup.policy": &p}, c.Topics().Parked); err != nil {
				t.Fatal(err)
			}
		}
		n, err := EnsureParked(ctx, adm, c)
		switch {
		case tc.ok && err != nil:
			t.Errorf("%s: %v", tc.prefix, err)
		case !tc.ok && !errors.Is(err, ErrParkedNotCompacted):
			t.Errorf("%s: err %v, want ErrParkedNotCompacted", tc.prefix, err)
		case tc.prefix == "fresh" && n != 4, tc.prefix == "compacted" && n != 2:
			t.Errorf("%s: %d partitions", tc.prefix, n)
		}
		cl.Close()
	}
}
