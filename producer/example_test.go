package producer_test

import (
	"context"
	"fmt"

	"github.com/playpipe/playpipe/internal/kafkax"
	"github.com/playpipe/playpipe/producer"
)

// A fleet backend publishes a batch and learns, per event, whether it is on
// the topic.
func ExamplePublisher_Publish() {
	broker, err := kafkax.StartEmbedded("plays", 3) // use your brokers instead
	if err != nil {
		panic(err)
	}
	defer broker.Close()

	ctx := context.Background()
	pub, err := producer.NewPublisher(ctx, producer.PublisherConfig{
		Kafka: kafkax.Config{Brokers: broker.Addrs(), Partitions: 3},
	})
	if err != nil {
		panic(err)
	}
	defer pub.Close(ctx)

	results, err := pub.Publish(ctx, [][]byte{
		[]byte(`{"event_id":"e-1","mix_id":1001,"started_at":1704067200000,"offset_ms":0,"duration_ms":185000,"user_id":"u-1","country":"DE","os":"iOS 17.4","device":"phone","vendor":1}`),
		[]byte(`{"event_id":"e-2","mix_id":1001,"started_at":1704067385000,"offset_ms":185000,"duration_ms":0,"user_id":"u-1","country":"Germany","os":"iOS 17.4","device":"phone","vendor":1}`),
	})
	if err != nil { // only when Kafka did not acknowledge a valid event
		panic(err)
	}
	for _, r := range results {
		fmt.Println(r.Index, r.EventID, r.Status, r.Violations)
	}
	// Output:
	// 0 e-1 accepted []
	// 1 e-2 refused [bad_duration (duration_ms): duration_ms must be > 0, got 0 bad_country (country): country must be two ASCII letters (ISO 3166-1 alpha-2), got "Germany"]
}
