package kafkax

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

func TestTopicsFor(t *testing.T) {
	if got := TopicsFor("").All(); strings.Join(got, ",") != "plays.events,plays.reports,plays.rejected,plays.deliveries,plays.parked" {
		t.Fatalf("default topics %v", got)
	}
	if got := TopicsFor("acme.eu").Deliveries; got != "acme.eu.deliveries" {
		t.Fatalf("prefixed topic %q", got)
	}
}

func TestValidateNamesTheFlag(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		flag string
	}{
		{Config{Partitions: 1, SASLMechanism: "GSSAPI"}, "--kafka-sasl"},
		{Config{Partitions: 1, SASLMechanism: "PLAIN"}, "--kafka-user"},
		{Config{Partitions: 0}, "--partitions"},
		{Config{Partitions: 1, EmbeddedPort: 70000}, "--embedded-kafka-port"},
		{Config{Partitions: 1, Brokers: []string{"kafka-1"}}, "host:port"},
		{Config{Partitions: 1, Brokers: []string{"k:9092"}, Embedded: true}, "--embedded-kafka"},
		{Config{Partitions: 1, EmbeddedPort: 19092}, "--embedded-kafka"},
	} {
		err := c.cfg.Validate()
		if err == nil || !strings.Contains(err.Error(), c.flag) {
			t.Errorf("%+v: error %v, want one naming %s", c.cfg, err, c.flag)
		}
	}
	if err := (Config{Partitions: 3, SASLMechanism: "scram-sha-512", SASLUser: "u", Brokers: []string{"k:9092"}}).Validate(); err != nil {
		t.Errorf("valid config refused: %v", err)
	}
}

// TestEmbeddedBroker: the embedded broker speaks the protocol on loopback,
// has the four topics, and EnsureTopics and Ping work against it.
func TestEmbeddedBroker(t *testing.T) {
	e, err := StartEmbedded("plays", 2)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	cfg := Config{Brokers: e.Addrs(), TopicPrefix: "plays", Partitions: 2, ReplicationFactor: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := Ping(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if err := EnsureTopics(ctx, cfg); err != nil { // already there: not an error
		t.Fatal(err)
	}
	other := cfg
	other.TopicPrefix = "other"
	if err := EnsureTopics(ctx, other); err != nil {
		t.Fatal(err)
	}
	opts, _ := cfg.ClientOpts()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	md, err := kadm.NewClient(cl).ListTopics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, topic := range append(cfg.Topics().All(), other.Topics().All()...) {
		if d, ok := md[topic]; !ok || len(d.Partitions) != 2 {
			t.Errorf("topic %s: %v", topic, d)
		}
	}
	if err := Ping(ctx, Config{Brokers: []string{"127.0.0.1:1"}, Partitions: 1}); err == nil {
		t.Error("ping of a closed port succeeded")
	}
}

// TestReady: with neither brokers nor Embedded Ready refuses, naming both;
// with Embedded it starts the embedded broker and the topics exist; with a
// bad config it refuses before starting anything.
func TestReady(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if _, _, err := Ready(ctx, Config{Partitions: 0}, log); err == nil || !strings.Contains(err.Error(), "--partitions") {
		t.Fatalf("bad config: %v", err)
	}
	_, _, err := Ready(ctx, Config{TopicPrefix: "r", Partitions: 2, ReplicationFactor: -1}, log)
	if !errors.Is(err, ErrNoBrokers) || !strings.Contains(err.Error(), "--brokers") || !strings.Contains(err.Error(), "--embedded-kafka") {
		t.Fatalf("no brokers, no --embedded-kafka: err %v, want ErrNoBrokers naming --brokers and --embedded-kafka", err)
	}
	cfg, stop, err := Ready(ctx, Config{TopicPrefix: "r", Partitions: 2, ReplicationFactor: -1, Embedded: true}, log)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if len(cfg.Brokers) != 1 || cfg.Embedded {
		t.Fatalf("brokers %v", cfg.Brokers)
	}
	if err := Ping(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	again, stop2, err := Ready(ctx, cfg, log) // configured brokers: nothing started, topics already there
	if err != nil || again.Brokers[0] != cfg.Brokers[0] {
		t.Fatalf("ready on configured brokers: %v %v", again.Brokers, err)
	}
	stop2()
	if err := Ping(ctx, cfg); err != nil {
		t.Fatalf("the no-op stop stopped the broker: %v", err)
	}
}
