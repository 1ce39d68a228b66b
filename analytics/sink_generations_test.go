package analytics

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/playpipe/playpipe/internal/kafkax"
)

// TestGenerationsOldBrokerFetchWithoutIDs: a rejection's src_topic_id must
// be the id its event's rows carry as kafka_topic_id, or the audit does not
// match the two. Fetch carries topic ids from v13 (Apache Kafka 3.1) while
// Metadata has had them since v10 (2.8): on a broker from 2.8 to 3.0 the
// events' rows have none, and the reader must not take the events topic's
// id from the metadata for their rejections either. kfake advertising 3.0's
// versions, then the current ones: after a poll of a rejection, the id the
// reader gives rejections is the one the events topic's own fetch carries.
func TestGenerationsOldBrokerFetchWithoutIDs(t *testing.T) {
	for _, c := range []struct {
		name     string
		versions *kversion.Versions // nil: kfake's own (current)
	}{
		{"kafka 3.0", kversion.V3_0_0()},
		{"kafka 2.8", kversion.V2_8_0()},
		{"current", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			topics := kafkax.TopicsFor(kafkax.DefaultTopicPrefix)
			opts := []kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(1, topics.Events, topics.Rejected)}
			if c.versions != nil {
				opts = append(opts, kfake.MaxVersions(c.versions))
			}
			cluster, err := kfake.NewCluster(opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer cluster.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()

			prod, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ProducerLinger(0))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			if err := prod.ProduceSync(ctx,
				&kgo.Record{Topic: topics.Events, Value: []byte(`{}`)},
				&kgo.Record{Topic: topics.Rejected, Value: []byte(`{}`)},
			).FirstErr(); err != nil {
				t.Fatal(err)
			}
			md, err := kadm.NewClient(prod).ListTopics(ctx, topics.Events)
			if err != nil {
				t.Fatal(err)
			}
			metaID := topicIDString(md[topics.Events].ID)
			if metaID == "" {
				t.Fatal("the broker's metadata names no topic id: the test proves nothing")
			}

			// One reader polls the rejection alone (the events topic's id
			// is not known yet: the reader asks the metadata), another the
			// event: the id its rows get.
			read := func(topic string) (kgo.Fetches, *kgo.Client) {
				cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics(topic),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cl.Close)
				for {
					fs := cl.PollFetches(ctx)
					if err := ctx.Err(); err != nil {
						t.Fatalf("no record of %s: %v", topic, err)
					}
					if fs.NumRecords() > 0 {
						return fs, cl
					}
				}
			}
			evFetches, _ := read(topics.Events)
			eventRowsID := ""
			evFetches.EachTopic(func(ft kgo.FetchTopic) { eventRowsID = topicIDString(ft.TopicID) })

			rejFetches, rejClient := read(topics.Rejected)
			g := &generations{adm: kadm.NewClient(rejClient), events: topics.Events, rejected: topics.Rejected, ids: map[string]string{}, log: testLogger()}
			g.see(ctx, rejFetches)
			t.Logf("metadata id %q, event rows' kafka_topic_id %q, rejections' src_topic_id %q", metaID, eventRowsID, g.ids[topics.Events])
			if got := g.ids[topics.Events]; got != eventRowsID {
				t.Errorf("rejections' src_topic_id %q, the events' rows kafka_topic_id %q: the audit would not match them", got, eventRowsID)
			}
		})
	}
}
