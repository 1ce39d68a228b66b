package producer_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/playpipe/playpipe/producer"
	"github.com/playpipe/playpipe/schemas"
)

// A fleet backend publishes a batch and learns, per event, whether it is on
// the topic. Only the public API is used: copy it, and put your brokers
// (and SASL, TLS) in the Config instead of the in-process test cluster.
func ExamplePublisher_Publish() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, "plays.events"))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	ctx := context.Background()
	pub, err := producer.NewPublisher(ctx, producer.Config{
		Brokers: cluster.ListenAddrs(), // e.g. []string{"kafka-1:9092", "kafka-2:9092"}
		// SASL: producer.SASL{Mechanism: producer.SASLScramSHA512, User: "fleet", Password: os.Getenv("KAFKA_PASSWORD")},
		// TLS:  producer.TLS{Enabled: true},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close(ctx)

	// started_at is epoch milliseconds near now: producer.StartedAt turns a
	// time.Time into it (seconds would be refused implausible_time).
	began := time.Now().Add(-4 * time.Minute)
	results, err := pub.Publish(ctx, [][]byte{
		fmt.Appendf(nil, `{"event_id":"e-1","mix_id":1001,"started_at":%d,"offset_ms":0,"duration_ms":185000,"user_id":"u-1","country":"DE","os":"iOS 17.4","device":"phone","vendor":1}`, producer.StartedAt(began)),
		fmt.Appendf(nil, `{"event_id":"e-2","mix_id":1001,"started_at":%d,"offset_ms":185000,"duration_ms":0,"user_id":"u-1","country":"Germany","os":"iOS 17.4","device":"phone","vendor":1}`, producer.StartedAt(began.Add(185*time.Second))),
	})
	if err != nil { // only when Kafka did not acknowledge a valid event
		log.Fatal(err)
	}
	for _, r := range results {
		fmt.Println(r.Index, r.EventID, r.Status, r.Violations)
	}
	// Output:
	// 0 e-1 accepted []
	// 1 e-2 refused [bad_duration (duration_ms): duration_ms must be > 0, got 0 bad_country (country): country must be two ASCII letters (ISO 3166-1 alpha-2), got "Germany"]
}

// A fleet turns the moment a segment began playing into started_at with
// StartedAt: epoch milliseconds, whatever the time zone.
func ExampleStartedAt() {
	began := time.Date(2026, time.January, 11, 4, 30, 0, 0, time.FixedZone("CET", 3600))
	ev := schemas.PlayerEvent{EventID: "e-1", MixID: 1001, StartedAt: producer.StartedAt(began), OffsetMS: 0, DurationMS: 185000}
	// Not ev.StartedAt = began.Unix(): seconds reach the partner as January 1970,
	// and the pipeline refuses them as implausible_time.
	fmt.Println(ev.StartedAt, time.UnixMilli(ev.StartedAt).UTC().Format(time.RFC3339))
	// Output:
	// 1768102200000 2026-01-11T03:30:00Z
}
